#!/bin/bash
python3 - <<'PY'
path = "/app/stats.py"
src = open(path).read()
start = src.index("def median(")
fixed = '''def median(values):
    """Return the median of a non-empty list of numbers.

    For an even number of values the median is the average of the two middle values.
    The list passed in must not be modified.
    """
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2
'''
open(path, "w").write(src[:start] + fixed)
PY
