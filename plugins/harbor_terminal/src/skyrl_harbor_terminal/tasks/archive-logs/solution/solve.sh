#!/bin/bash
set -e
cd /app
if compgen -G 'logs/*.log' > /dev/null; then
    tar -czf /app/logs.tar.gz logs/*.log
    rm -f logs/*.log
fi
