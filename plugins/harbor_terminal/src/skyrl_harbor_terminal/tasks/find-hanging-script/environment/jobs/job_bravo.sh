#!/bin/bash
# Wait a moment for a (simulated) lock, then report.
sleep 1
echo "lock acquired"
