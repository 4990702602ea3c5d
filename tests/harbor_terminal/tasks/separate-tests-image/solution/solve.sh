#!/bin/bash
echo separate > /app/answer.txt
