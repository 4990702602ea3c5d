#!/bin/bash
set -e
cd /app
cat $(ls notes/*.txt | sort) > digest.txt
