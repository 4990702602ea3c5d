#!/bin/bash
wc -l < /app/data/names.txt > /app/count.txt
