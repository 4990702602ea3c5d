"""The built-in sandbox backends, one package each, registered in ``skyrl_sandbox.backends`` like any other.

- :mod:`.bwrap`: bubblewrap namespaces over the host's read-only system folders;
- :mod:`.docker`: containers of a Docker-API engine (its code is shared by other container runtimes);
- :mod:`.subprocess`: a plain child process, weaker, chosen only by name.
"""
