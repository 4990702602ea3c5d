#!/bin/bash
# Copy the data folder to a dated backup folder.
cp -r /app/data "/app/backup-$(date +%F)"
