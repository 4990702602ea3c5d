#!/bin/bash
chmod u+x /app/bin/*.sh
chmod 600 /app/secret/token.txt
