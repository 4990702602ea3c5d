#!/bin/bash
mkdir -p /app/project/bin /app/project/data
cp /app/input/*.txt /app/project/data/
