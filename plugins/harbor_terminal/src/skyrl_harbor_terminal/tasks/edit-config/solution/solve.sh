#!/bin/bash
sed -i -e 's/^port = .*/port = 8080/' \
       -e 's/^debug = .*/debug = false/' \
       -e 's/^# log_level = info$/log_level = info/' /app/app.conf
