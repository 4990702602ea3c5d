#!/bin/bash
set -euo pipefail
word=$(python3 -c "import os, urllib.request; print(urllib.request.urlopen(os.environ['API_URL'] + '/secret').read().decode())")
printf '%s\n' "$word" > /app/answer.txt
python3 - "$word" <<'PY'
import os, sys, urllib.request
body = sys.argv[1][::-1].encode()
urllib.request.urlopen(urllib.request.Request(os.environ["API_URL"] + "/answer", data=body, method="POST")).read()
PY
