"""Worker entry point: start up trusted, lock down, then serve execute requests until EOF.

Order matters: the parent-death signal, resource limits, the seccomp filter and the context are
set up before the audit policy is installed; from then on nothing the model runs can undo them.
"""

from __future__ import annotations

import os
import traceback
from typing import Any

from skyrl_sandbox_runtime import kernel
from skyrl_sandbox_runtime.channel import Channel, connect

from .policy import SandboxPolicy
from .repl import Repl


def main(spawn_json: str) -> int:
    connected = connect(spawn_json)
    if connected is None:
        return 0
    channel, init = connected
    warnings: list[str] = []
    try:
        repl, requests = _initialise(init, channel, warnings)
    except BaseException as exc:  # noqa: B036 - report anything, including SystemExit from the scaffold
        channel.send({"op": "init_done", "error": "".join(traceback.format_exception(exc))[-8000:]})
        return 1
    channel.send({"op": "init_done", "error": None, "warnings": warnings})
    return _serve(repl, channel, requests)


def _initialise(init: dict, channel: Channel, warnings: list[str]) -> tuple[Repl, RequestSender]:
    warnings += kernel.lock_down(init)
    kernel.forget_ctypes()
    context_text = None
    path = init.get("context_path")
    if path:
        with open(path, encoding="utf-8", errors="surrogatepass") as handle:
            context_text = handle.read()
    stdlib = os.path.dirname(os.__file__)
    SandboxPolicy(read_roots=[stdlib, *init["read_roots"]], write_roots=[init["tmp_dir"]],
                  denied_roots=[os.path.join(stdlib, "site-packages")],
                  allow_subprocesses=init["allow_subprocesses"]).install()
    os.chdir(init["tmp_dir"])
    requests = RequestSender(channel)
    repl = Repl(context_text, bool(path) and not path.endswith(".txt"), init["rpc_methods"], requests.send,
                max_output_chars=init["max_output_chars"], echo_last_expression=init["echo_last_expression"])
    repl.run_scaffold(init["scaffold_code"])
    return repl, requests


def _serve(repl: Repl, channel: Channel, requests: RequestSender) -> int:
    while True:
        try:
            with channel.lock:
                message = channel.receive()
        except EOFError:
            return 0
        if message.get("op") == "exec":
            requests.token = message["token"]
            result = repl.execute(message["code"])
            channel.send({"op": "result", "seq": message["seq"], "token": message["token"], **result})
            requests.token = None


class RequestSender:
    """Sends one request to the parent and blocks until its answer arrives.

    Each request carries the token of the execution it belongs to: the parent refuses requests
    that are not bound to the execution it is running.
    """

    def __init__(self, channel: Channel) -> None:
        self._channel = channel
        self._next_id = 0
        self.token: str | None = None

    def send(self, method: str, params: dict) -> Any:
        with self._channel.lock:
            self._next_id += 1
            request_id = self._next_id
            self._channel.send({"op": "rpc", "token": self.token, "id": request_id, "method": method,
                                "params": params})
            reply = self._channel.receive()
        if reply.get("op") != "rpc_result" or reply.get("id") != request_id:
            raise RuntimeError(f"{method}: the host sent an unexpected reply")
        if reply.get("error") is not None:
            raise RuntimeError(f"{method} failed: {reply['error']}")
        return reply.get("value")
