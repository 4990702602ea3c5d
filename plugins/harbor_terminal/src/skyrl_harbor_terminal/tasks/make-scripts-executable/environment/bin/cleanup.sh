#!/bin/bash
find /app/tmp -type f -name "*.tmp" -delete
