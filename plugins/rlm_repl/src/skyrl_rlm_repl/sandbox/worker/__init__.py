"""The side of the sandbox that runs inside the worker process.

Standard library only: inside bubblewrap only the Python standard library is visible. Started as
``python -I -S -B -c <bootstrap> <dir holding this package>``; see ``main.py``.
"""
