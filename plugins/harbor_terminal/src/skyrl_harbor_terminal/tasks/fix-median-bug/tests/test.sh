#!/bin/bash
# Verifier (runs as root after the agent). The agent's module is imported only as the unprivileged
# user `agent` (when there is one), under a timeout; its output is data, compared by root with
# medians computed here by Python's statistics module on cases the agent never saw.
. /tests/verifier.sh || exit 1

[ -f /app/stats.py ] && [ ! -L /app/stats.py ] || fail "/app/stats.py is missing or not a regular file"

CASES='[[3, 1, 2], [4, 1, 3, 2], [7], [10, -2], [5, 5, 5, 1], [9, 8, 7, 6, 5, 4, 3, 2, 1],
[2.5, -1.25, 8.0, 3.5], [100, 1, 50, 25, 75, 0], [-3, -7, -1], [1, 2, 2, 3, 9, 11, 14, 0],
[13, 21, 8, 5, 3, 2, 1, 1], [0.1, 0.3, 0.2], [6, 2, 9, 4, 4, 7, 1, 3, 8, 5, 10, 11]]'

# Runs as the agent: import the module, call median on a copy of every case, and report
# the result and the (possibly modified) argument as JSON.
HARNESS='
import json, sys
sys.path.insert(0, "/app")
cases = json.loads(sys.argv[1])
from stats import median
out = []
for case in cases:
    arg = list(case)
    try:
        value = median(arg)
        out.append({"value": float(value), "arg": arg})
    except Exception as exc:
        out.append({"error": repr(exc)})
print(json.dumps(out))
'
errfile=$(mktemp) || fail "mktemp failed"
output=$(as_agent timeout -k 2 10 python3 -I -B -c "$HARNESS" "$CASES" 2>"$errfile" | head -c 100000)
head -c 2000 "$errfile"; rm -f "$errfile"

# Root-side comparison (isolated interpreter, no agent code involved).
CHECK='
import json, math, statistics, sys
cases = json.loads(sys.argv[1])
try:
    results = json.loads(sys.stdin.read())
except ValueError:
    print("FAIL: no JSON result from the harness"); sys.exit(1)
if not isinstance(results, list) or len(results) != len(cases):
    print("FAIL: wrong number of results"); sys.exit(1)
ok = True
for case, res in zip(cases, results):
    want = statistics.median(case)
    if not isinstance(res, dict) or "value" not in res:
        print("FAIL:", case, "->", res); ok = False; continue
    value = res["value"]
    if not isinstance(value, (int, float)) or not math.isclose(value, want, rel_tol=1e-9, abs_tol=1e-9):
        print("FAIL: median(%r) returned %r, expected %r" % (case, value, want)); ok = False
    if res.get("arg") != case:
        print("FAIL: median(%r) modified its argument to %r" % (case, res.get("arg"))); ok = False
sys.exit(0 if ok else 1)
'
printf '%s' "$output" | timeout 10 python3 -I -c "$CHECK" "$CASES" || fail "median is still wrong"

echo PASS
echo 1 > "$REWARD"
