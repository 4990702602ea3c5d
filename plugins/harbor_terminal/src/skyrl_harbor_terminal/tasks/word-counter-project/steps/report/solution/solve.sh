#!/bin/bash
/app/project/bin/count_words.sh /app/project/data > /app/project/report.txt
