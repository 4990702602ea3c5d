#!/bin/bash
jq -r '.[] | select(.active == true and any(.roles[]; . == "admin")) | .name' /app/users.json \
    | LC_ALL=C sort > /app/admins.txt
