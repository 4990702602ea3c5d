#!/bin/bash
set -e
cd /app/repo
git checkout -q -b feature/greeting main 2>/dev/null || git checkout -q feature/greeting
git commit -q -m "Add greeting helper"
