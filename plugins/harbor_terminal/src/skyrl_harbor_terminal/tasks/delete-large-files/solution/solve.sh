#!/bin/bash
find /app/cache -type f -size +102400c -delete
