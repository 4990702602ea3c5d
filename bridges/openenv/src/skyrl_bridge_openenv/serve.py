"""The child process of mode 'server': OpenEnv's own ``create_app`` for one env, served by uvicorn on 127.0.0.1.

It binds a free port itself, writes the port to ``--port-file`` (the parent then waits for ``/health``), and exits
when its parent process is gone, so a crashed trainer leaves no server behind. Not a user command.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import socket
import sys
import threading
import time
import traceback


class LoggedFactory(functools.partial):
    """The env's constructor with ``env.args``; what it raises is printed to the server's log before OpenEnv's
    server answers a bare "factory failed" (the parent shows the log's tail with the error).

    A ``functools.partial``, so OpenEnv's server still reads the env class's flags through ``.func``."""

    def __call__(self, *args, **kwargs):
        try:
            return super().__call__(*args, **kwargs)
        except Exception:
            traceback.print_exc()
            sys.stderr.flush()
            raise


def _watch_parent(parent: int) -> None:
    while True:
        time.sleep(1.0)
        if os.getppid() != parent:
            os._exit(0)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m skyrl_bridge_openenv.serve")
    for flag in ("--env", "--action", "--observation", "--args", "--port-file"):
        parser.add_argument(flag, required=True)
    parser.add_argument("--parent", type=int, default=0)
    options = parser.parse_args(argv)
    for entry in reversed(json.loads(os.environ.get("SKYRL_OPENENV_SYS_PATH", "[]"))):
        if entry not in sys.path:
            sys.path.insert(0, entry)

    from skyrl_bridge_openenv._peer import load_openenv_core

    load_openenv_core()
    import uvicorn
    from openenv.core.env_server.http_server import create_app

    from skyrl_bridge_openenv.catalog import import_path

    env_cls = import_path(options.env, "env")
    args = json.loads(options.args)
    factory = LoggedFactory(env_cls, **args)
    app = create_app(factory, import_path(options.action, "action"), import_path(options.observation, "observation"),
                     max_concurrent_envs=1)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    temporary = options.port_file + ".tmp"
    with open(temporary, "w") as handle:
        handle.write(str(sock.getsockname()[1]))
    os.replace(temporary, options.port_file)
    if options.parent:
        threading.Thread(target=_watch_parent, args=(options.parent,), daemon=True).start()
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", ws="websockets-sansio"
                                          if _has_sansio() else "auto", timeout_graceful_shutdown=2))
    server.run(sockets=[sock])


def _has_sansio() -> bool:
    try:
        import uvicorn.protocols.websockets.websockets_sansio_impl  # noqa: F401
    except ImportError:
        return False
    return True


if __name__ == "__main__":
    main()
