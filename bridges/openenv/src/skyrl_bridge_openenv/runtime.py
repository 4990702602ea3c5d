"""Where an OpenEnv env runs: in this process, or behind OpenEnv's own server (started here, or at a URL).

Every runtime answers ``reset(seed) -> Reply`` and ``step(action) -> Reply`` with the observation's fields as
OpenEnv serialises them (reward, done and metadata apart), so the three modes render the same text.

- :class:`InProcess` calls the Environment under core's process-wide peer lock and puts back the global ``random``
  and ``numpy.random`` states after each call (``skyrl_core.peer_rng.global_rng_kept``): an env that seeds or
  draws from them leaves the process's RNG as it was.
- :class:`Remote` talks to a server through OpenEnv's ``GenericEnvClient`` (WebSocket, one session per env), its
  coroutines all run on one background event loop, so the sync and async forms share the connection. Every wait
  is bounded (``timeout_s``); a dead or silent server raises :class:`ServerError` with what is known about it.
- :class:`ServerProcess` starts ``python -m skyrl_bridge_openenv.serve`` (OpenEnv's ``create_app`` under uvicorn
  on 127.0.0.1, a port the child binds itself), waits for ``/health`` and stops it on close or at exit.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import inspect
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from skyrl_core import peer_loop
from skyrl_core.peer_rng import global_rng_kept

from skyrl_bridge_openenv._peer import load_openenv_core

load_openenv_core()  # openenv.core without its web UI's import time

T = TypeVar("T")


@dataclass
class Reply:
    observation: dict[str, Any]
    reward: float | None
    done: bool


class ServerError(RuntimeError):
    """The OpenEnv server failed, died or did not answer in time."""


class ActionRefused(RuntimeError):
    """The server refused the action as invalid (its own validation); the model is told, the episode goes on."""


# -- in process ----------------------------------------------------------------------------------


def _observation_reply(observation: Any) -> Reply:
    from openenv.core.env_server.serialization import serialize_observation

    data = serialize_observation(observation)  # what OpenEnv's server sends: the same text in every mode
    return Reply(dict(data["observation"]), data["reward"], bool(data["done"]))


def _accepted(function: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError):
        return kwargs
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return kwargs
    return {key: value for key, value in kwargs.items() if key in parameters}


class InProcess:
    def __init__(self, env_cls: type, args: dict[str, Any]) -> None:
        self.env_cls, self.args = env_cls, dict(args)
        self.env: Any = None

    def _env(self) -> Any:
        if self.env is None:
            try:
                self.env = self.env_cls(**self.args)
            except TypeError as exc:
                raise ValueError(f"env.args {self.args!r} do not fit {self.env_cls.__name__}(): {exc}") from exc
        return self.env

    def reset(self, seed: int) -> Reply:
        with global_rng_kept():
            env = self._env()
            # as OpenEnv's server calls it: only the keywords reset() takes (the template env takes none)
            return _observation_reply(env.reset(**_accepted(env.reset, {"seed": seed})))

    def step(self, action: Any) -> Reply:
        with global_rng_kept():
            return _observation_reply(self._env().step(action))

    async def areset(self, seed: int) -> Reply:
        return await asyncio.to_thread(self.reset, seed)

    async def astep(self, action: Any) -> Reply:
        return await asyncio.to_thread(self.step, action)

    def call(self, method: str) -> Any:
        """``env.<method>()`` when the peer defines it (bridge hooks such as ``gold_actions``), else None."""
        function = getattr(self.env, method, None)
        if not callable(function):
            return None
        with global_rng_kept():
            return function()

    def close(self) -> None:
        env, self.env = self.env, None
        if env is not None:
            with global_rng_kept():
                env.close()


# -- a server ------------------------------------------------------------------------------------


class Remote:
    """One OpenEnv client session on the server at ``url`` (``server``: the process behind it, when ours)."""

    def __init__(self, url: str, timeout_s: float, server: ServerProcess | None = None) -> None:
        self.url, self.timeout_s, self.server = url, timeout_s, server
        self.client: Any = None
        self.broken = False  # a call failed: close without the polite goodbye (nobody may be listening)

    # The margin lets the client's own timeouts fire first (their message is the clearer one).
    def _bound(self) -> float:
        return self.timeout_s * 2 + 5

    async def _reset(self, seed: int) -> Reply:
        from openenv.core.generic_client import GenericEnvClient

        if self.client is None:
            self.client = GenericEnvClient(base_url=self.url, connect_timeout_s=self.timeout_s,
                                           message_timeout_s=self.timeout_s)
            await self.client.connect()
        result = await self.client.reset(seed=seed)
        return Reply(dict(result.observation or {}), result.reward, bool(result.done))

    async def _step(self, payload: dict[str, Any]) -> Reply:
        if self.client is None:
            raise ServerError("step before reset: no session with the OpenEnv server")
        result = await self.client.step(payload)
        return Reply(dict(result.observation or {}), result.reward, bool(result.done))

    def reset(self, seed: int) -> Reply:
        return self._call(lambda: self._reset(seed), "reset")

    def step(self, action: Any) -> Reply:
        return self._call(lambda: self._step(_payload(action)), "step")

    async def areset(self, seed: int) -> Reply:
        return await self._acall(lambda: self._reset(seed), "reset")

    async def astep(self, action: Any) -> Reply:
        return await self._acall(lambda: self._step(_payload(action)), "step")

    def _call(self, make: Any, what: str) -> Reply:
        self._check_alive(what)
        try:
            return peer_loop.run(make(), self._bound())
        except Exception as exc:  # noqa: BLE001 - said plainly below
            raise self._explain(exc, what) from exc

    async def _acall(self, make: Any, what: str) -> Reply:
        self._check_alive(what)
        try:
            return await peer_loop.arun(make(), self._bound())
        except Exception as exc:  # noqa: BLE001
            raise self._explain(exc, what) from exc

    def _check_alive(self, what: str) -> None:
        if self.server is not None and self.server.exit_code() is not None:
            raise self.server.died(what)

    def _explain(self, exc: BaseException, what: str) -> Exception:
        text = str(exc)
        if "code: VALIDATION_ERROR" in text:
            return ActionRefused(text)
        self.broken = True
        if self.server is not None:
            for _ in range(20):  # a killed server's socket closes before its exit status is known
                if self.server.exit_code() is not None:
                    return self.server.died(what)
                time.sleep(0.05)
        if isinstance(exc, (TimeoutError, asyncio.TimeoutError, concurrent.futures.TimeoutError)):
            return ServerError(f"the OpenEnv server at {self.url} did not answer {what} within {self.timeout_s:g} s "
                               "(env.timeout_s)")
        log = f"\nserver log:\n{self.server.log_tail()}" if self.server is not None else ""
        return ServerError(f"OpenEnv server at {self.url}, {what}: {type(exc).__name__}: {text}{log}")

    def close(self) -> None:
        client, self.client = self.client, None
        if client is not None:
            with contextlib.suppress(Exception):
                peer_loop.run(client.disconnect() if not self.broken else _drop(client), 5.0)
        if self.server is not None:
            self.server.stop(at_once=self.broken)


async def _drop(client: Any) -> None:
    if client._ws is not None:
        client._ws.transport.abort()  # no close handshake with a server that stopped answering
        client._ws = None


def _payload(action: Any) -> dict[str, Any]:
    return action.model_dump(mode="json", exclude={"metadata"}) if hasattr(action, "model_dump") else dict(action)


def fetch_schema(url: str, timeout_s: float) -> dict[str, Any]:
    """The action JSON schema the server at ``url`` publishes (``GET /schema``)."""
    import httpx

    base = url.replace("ws://", "http://").replace("wss://", "https://").rstrip("/")
    try:
        response = httpx.get(f"{base}/schema", timeout=timeout_s, trust_env=False)
        response.raise_for_status()
        return dict(response.json()["action"])
    except Exception as exc:  # noqa: BLE001
        raise ServerError(f"cannot read the action schema of the OpenEnv server at {base}/schema: "
                          f"{type(exc).__name__}: {exc}; give env.name=module:EnvironmentClass or "
                          "env.action=module:ActionClass") from exc


_servers: weakref.WeakSet[ServerProcess] = weakref.WeakSet()


@atexit.register
def _stop_all() -> None:
    for server in list(_servers):
        server.stop()


class ServerProcess:
    """OpenEnv's server for one env in a child process on 127.0.0.1; ``stop()`` ends it (also at exit)."""

    def __init__(self, env_path: str, action_path: str, observation_path: str, args: dict[str, Any],
                 start_timeout_s: float) -> None:
        self.label = env_path
        self.folder = Path(tempfile.mkdtemp(prefix="skyrl_openenv_server_"))
        self.log_path = self.folder / "server.log"
        port_file = self.folder / "port"
        command = [sys.executable, "-m", "skyrl_bridge_openenv.serve", "--env", env_path, "--action", action_path,
                   "--observation", observation_path, "--args", json.dumps(args), "--port-file", str(port_file),
                   "--parent", str(os.getpid())]
        environ = {**os.environ, "SKYRL_OPENENV_SYS_PATH": json.dumps([p for p in sys.path if p]),
                   "ENABLE_WEB_INTERFACE": "false"}
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                            env=environ)
        _servers.add(self)
        self.url = ""
        try:
            self._wait_ready(port_file, start_timeout_s)
        except BaseException:
            self.stop()  # the error already holds the log's tail
            raise

    def _wait_ready(self, port_file: Path, timeout_s: float) -> None:
        import httpx

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.exit_code() is not None:
                raise ServerError(f"the OpenEnv server for {self.label} exited with code {self.exit_code()} before it "
                                  f"was ready:\n{self.log_tail()}")
            if port_file.exists():
                url = f"http://127.0.0.1:{int(port_file.read_text())}"
                try:
                    if httpx.get(f"{url}/health", timeout=1.0, trust_env=False).status_code == 200:
                        self.url = url
                        return
                except httpx.HTTPError:
                    pass
            time.sleep(0.05)
        raise ServerError(f"the OpenEnv server for {self.label} did not answer /health within {timeout_s:g} s "
                          f"(env.server_start_timeout_s):\n{self.log_tail()}")

    def exit_code(self) -> int | None:
        return self.process.poll()

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:] or "(no output)"
        except OSError:
            return "(no output)"

    def died(self, what: str) -> ServerError:
        code = self.exit_code()
        how = f"killed by signal {-code}" if code is not None and code < 0 else f"exited with code {code}"
        return ServerError(f"the OpenEnv server for {self.label} (pid {self.process.pid}) {how} before {what} "
                           f"finished:\n{self.log_tail()}")

    def stop(self, at_once: bool = False) -> None:
        if self.process.poll() is None and at_once:
            self.process.kill()
            self.process.wait(5)
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(3)
            except subprocess.TimeoutExpired:  # a step still running in the server holds it
                self.process.kill()
                self.process.wait(5)
        _servers.discard(self)
        shutil.rmtree(self.folder, ignore_errors=True)
