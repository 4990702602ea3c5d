"""Rollout engines placed outside the trainer's process, behind the same ``InferenceEngine`` protocol.

``trainer.engine_placement`` chooses where the engine runs:

* ``process`` (:class:`ProcessEngine`): a spawned child process builds the engine from its class and
  config and serves requests on its own asyncio loop, so many ``generate`` calls are in flight at once
  and batch inside the child engine exactly as they would in process. Requests and replies travel over
  a duplex :func:`multiprocessing.Pipe`; the parent reads replies on a thread and resolves the callers'
  futures on their own event loops, so no loop ever blocks on the pipe. ``update_weights`` moves
  tensors through shared memory: CPU tensors are copied into shared buffers that the child maps once
  (the next updates copy into the same buffers and send only names), CUDA tensors go through torch's
  CUDA IPC handles; nothing is pickled by value.
* ``ray`` (:class:`RayEngine`): an async Ray actor holds the engine (Ray runs its coroutines
  concurrently, so requests batch the same way); weights go through Ray's object store. With
  ``engine.replicas`` > 1, :class:`~.replicas.RayEngineReplicas` runs several such actors behind one client.

Both pass through what the inner engine offers: ``weight_version`` (refreshed from every reply),
``in_flight_updates``, and the optional ``release_memory`` / ``sleep`` / ``wake_up`` methods. The
tokenizer is shipped once from the child (or loaded in the parent from ``config.model`` when it does
not pickle). A child that dies fails the pending and all later calls with :class:`EngineError` naming
its exit code; an engine that fails to build raises :class:`EngineError` with the child's message.
"""

from __future__ import annotations

import asyncio
import importlib
import itertools
import os
import pickle
import threading
import traceback
from collections.abc import Iterable, Mapping
from typing import Any

from skyrl_core import ray_cluster
from skyrl_core.engine import EngineError, GenerateOutput, SamplingParams

#: Optional engine methods forwarded to the remote engine when it has them.
OPTIONAL_METHODS = ("release_memory", "sleep", "wake_up")
#: Engine attributes mirrored in the client (refreshed after every reply).
MIRRORED_ATTRS = ("weight_version", "in_flight_updates")

_SPAWN_HINT = ("The engine runs in a spawned process that re-imports the main module: a training script must "
               "call fit() under `if __name__ == \"__main__\":`.")


def resolve_engine_class(engine_cls: Any) -> Any:
    """A class, or ``"module:attr"`` imported here (how a child process receives it)."""
    if isinstance(engine_cls, str):
        module, _, attr = engine_cls.partition(":")
        return getattr(importlib.import_module(module), attr)
    return engine_cls


def class_path(engine_cls: Any) -> str:
    """``"module:attr"`` of an engine class (how a child process or actor is told which one to build)."""
    if isinstance(engine_cls, str):
        return engine_cls
    return f"{engine_cls.__module__}:{engine_cls.__qualname__}"


def _mirrored(engine: Any) -> dict[str, Any]:
    return {name: getattr(engine, name) for name in MIRRORED_ATTRS if hasattr(engine, name)}


def _describe(engine: Any) -> dict[str, Any]:
    """What a client needs to know about the engine it fronts; the tokenizer pickled when it can be."""
    try:
        tokenizer = pickle.dumps(getattr(engine, "tokenizer", None))
    except Exception:  # noqa: BLE001 - the parent then loads it from config.model
        tokenizer = None
    return {"tokenizer": tokenizer, "methods": [m for m in OPTIONAL_METHODS if callable(getattr(engine, m, None))],
            "attrs": _mirrored(engine)}


def _portable(exc: BaseException) -> BaseException:
    """``exc`` with the remote traceback as a note, or an ``EngineError`` saying what it was when it does
    not pickle."""
    from multiprocessing.reduction import ForkingPickler

    remote_tb = "".join(traceback.format_exception(exc))
    try:
        exc.add_note(f"(raised in the engine process {os.getpid()}; its traceback:)\n{remote_tb}")
        ForkingPickler.dumps(exc)
        return exc
    except Exception:  # noqa: BLE001
        return EngineError(f"{type(exc).__name__}: {exc}\n(raised in the engine process; its traceback:)\n{remote_tb}")


# --------------------------------------------------------------------------------------- the child side


def _child_main(conn: Any, engine_cls: Any, engine_config: Any, num_threads: int | None) -> None:
    """Body of the engine process: build the engine, then serve requests until closed or orphaned."""
    import torch
    import torch.multiprocessing  # noqa: F401 - registers tensor reductions (shared memory) for the pipe

    if num_threads:
        torch.set_num_threads(num_threads)
    try:
        engine = resolve_engine_class(engine_cls)(engine_config)
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        message = "".join(traceback.format_exception_only(exc)).strip()
        conn.send((0, "error", (message, "".join(traceback.format_exception(exc)))))
        return
    asyncio.run(_EngineServer(conn, engine).serve())


class _EngineServer:
    """Child side: a reader thread hands messages to the asyncio loop, each runs as its own task."""

    def __init__(self, conn: Any, engine: Any) -> None:
        self.conn, self.engine = conn, engine
        self.send_lock = threading.Lock()
        self.shared: dict[str, Any] = {}  # weight buffers in shared memory, mapped once, by name

    async def serve(self) -> None:
        loop = asyncio.get_running_loop()
        self.stopped = asyncio.Event()
        self.tasks: set[asyncio.Task[Any]] = set()
        self.send(0, "ok", _describe(self.engine))
        threading.Thread(target=self.read, args=(loop,), name="engine-server-reader", daemon=True).start()
        await self.stopped.wait()
        for task in list(self.tasks):
            task.cancel()
        close = getattr(self.engine, "close", None)
        if callable(close):
            close()

    def read(self, loop: asyncio.AbstractEventLoop) -> None:
        while True:
            try:
                message = self.conn.recv()
            except (EOFError, OSError):  # the parent is gone: stop serving
                loop.call_soon_threadsafe(self.stopped.set)
                return
            loop.call_soon_threadsafe(self.dispatch, message)
            if message[1] == "close":
                return

    def dispatch(self, message: tuple[int, str, Any]) -> None:
        task = asyncio.ensure_future(self.handle(*message))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def handle(self, request_id: int, op: str, payload: Any) -> None:
        try:
            result = await self.run(op, payload)
        except BaseException as exc:  # noqa: BLE001 - every failure goes back to the caller
            if isinstance(exc, asyncio.CancelledError):
                return
            self.send(request_id, "raise", _portable(exc))
            return
        self.send(request_id, "ok", result)
        if op == "close":
            self.stopped.set()

    async def run(self, op: str, payload: Any) -> Any:
        engine = self.engine
        if op == "generate":
            return await engine.generate(*payload)
        if op == "update_weights":
            names, new, direct = payload
            self.shared.update(new)
            return await engine.update_weights([(n, direct[n] if n in direct else self.shared[n]) for n in names])
        if op == "call":
            name, args, kwargs = payload
            if name not in OPTIONAL_METHODS:
                raise EngineError(f"engine method {name!r} is not forwarded")
            result = getattr(engine, name)(*args, **kwargs)
            return await result if asyncio.iscoroutine(result) else result
        if op == "getattr":
            return getattr(engine, payload)
        if op == "close":
            return None
        raise EngineError(f"unknown engine request {op!r}")

    def send(self, request_id: int, status: str, value: Any) -> None:
        with self.send_lock:
            try:
                self.conn.send((request_id, status, value, _mirrored(self.engine)))
            except (BrokenPipeError, EOFError, OSError):
                self.stopped.set()


# -------------------------------------------------------------------------------------- the parent side


class RemoteEngineClient:
    """What :class:`ProcessEngine` and :class:`RayEngine` share: mirrored attributes and optional methods."""

    config: Any
    tokenizer: Any
    _attrs: dict[str, Any]

    def _setup(self, engine_config: Any, info: dict[str, Any], tokenizer: Any = None) -> None:
        """Mirror ``info`` (from :func:`_describe`); ``tokenizer``, when given, is used instead of the shipped one."""
        self.config = engine_config
        self._attrs = dict(info["attrs"])
        if tokenizer is None and info["tokenizer"] is not None:
            tokenizer = pickle.loads(info["tokenizer"])
        if tokenizer is None and getattr(engine_config, "model", None):
            from skyrl_trainers.models import load_tokenizer

            tokenizer = load_tokenizer(engine_config.model)
        self.tokenizer = tokenizer
        for name in info["methods"]:
            setattr(self, name, self._forwarder(name))

    def _forwarder(self, name: str) -> Any:
        async def forward(*args: Any, **kwargs: Any) -> Any:
            return await self.call_remote(name, *args, **kwargs)

        forward.__name__ = name
        return forward

    def _mirror(self, attrs: Mapping[str, Any]) -> None:
        """Take the attributes a reply carried; ``weight_version`` never goes back (replies may arrive out of
        order: a request that finished before an update can be read after it)."""
        attrs = dict(attrs)
        mine, theirs = self._attrs.get("weight_version"), attrs.get("weight_version")
        if isinstance(mine, int) and isinstance(theirs, int) and theirs < mine:
            del attrs["weight_version"]
        self._attrs.update(attrs)

    def __getattr__(self, name: str) -> Any:
        attrs = self.__dict__.get("_attrs")
        if attrs is not None and name in attrs:
            return attrs[name]
        raise AttributeError(f"{type(self).__name__!s} has no attribute {name!r}")

    async def call_remote(self, name: str, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError


def _weights_payload(named_tensors: Mapping[str, Any] | Iterable[tuple[str, Any]],
                     shared: dict[str, Any]) -> tuple[list[str], dict[str, Any], dict[str, Any]]:
    """``(names, new shared buffers, CUDA tensors)``: CPU values are copied into ``shared`` buffers
    (allocated in shared memory the first time a name, shape or dtype is seen; only those travel)."""
    import torch

    items = list(named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors)
    names, new, direct = [], {}, {}
    with torch.no_grad():
        for name, value in items:
            if hasattr(value, "full_tensor"):
                value = value.full_tensor()
            value = value.detach() if isinstance(value, torch.Tensor) else torch.as_tensor(value)
            names.append(name)
            if value.is_cuda:
                direct[name] = value
                continue
            buffer = shared.get(name)
            if buffer is None or buffer.shape != value.shape or buffer.dtype != value.dtype:
                buffer = torch.empty(value.shape, dtype=value.dtype).share_memory_()
                shared[name] = new[name] = buffer
            buffer.copy_(value)
    return names, new, direct


class ProcessEngine(RemoteEngineClient):
    """An engine in a spawned child process (see the module docstring). Safe to call concurrently, from
    any event loop; ``close()`` ends the child."""

    def __init__(self, engine_cls: Any, engine_config: Any, *, num_threads: int | None = None,
                 start_timeout: float = 600.0) -> None:
        import torch.multiprocessing as mp

        self.engine_name = class_path(engine_cls).rpartition(":")[2]
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe(duplex=True)
        self._proc = ctx.Process(target=_child_main, args=(child, class_path(engine_cls), engine_config, num_threads),
                                 daemon=True, name=f"skyrl-engine-{self.engine_name}")
        self._proc.start()
        child.close()  # the child holds the only other end: its death reads as EOF here
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._lock = threading.Lock()
        self._failure: str | None = None
        self._closed = False
        self._shared: dict[str, Any] = {}
        self._weights_lock: asyncio.Lock | None = None
        self._setup(engine_config, self._startup(start_timeout))
        self._reader = threading.Thread(target=self._read, name="engine-client-reader", daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int | None:
        return self._proc.pid

    def _startup(self, timeout: float) -> dict[str, Any]:
        from multiprocessing.connection import wait

        ready = wait([self._conn, self._proc.sentinel], timeout=timeout)
        try:
            if self._conn not in ready:
                raise EOFError
            _, status, value, *_ = self._conn.recv()
        except (EOFError, OSError):
            self._terminate()
            what = (f"exited with code {self._proc.exitcode}" if ready else f"did not start within {timeout:.0f}s")
            raise EngineError(f"{self.engine_name} engine process {what} before it was ready. {_SPAWN_HINT}") from None
        if status == "error":
            message, remote_tb = value
            self._terminate()
            raise EngineError(f"{self.engine_name} engine failed to start in its process: {message}\n"
                              f"(child traceback:)\n{remote_tb}")
        return value

    # the protocol

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> GenerateOutput:
        return await self._request("generate", (list(prompt_ids), params))

    async def update_weights(self, named_tensors: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> None:
        """Send the weights through shared memory; returns once the child engine has loaded them."""
        if self._weights_lock is None:
            self._weights_lock = asyncio.Lock()
        async with self._weights_lock:  # the shared buffers hold one update at a time
            self._check()
            await self._request("update_weights", _weights_payload(named_tensors, self._shared))

    async def call_remote(self, name: str, *args: Any, **kwargs: Any) -> Any:
        return await self._request("call", (name, args, kwargs))

    async def remote_attr(self, name: str) -> Any:
        """An attribute of the engine in the child (e.g. ``batch_sizes``, for tests and benchmarks)."""
        return await self._request("getattr", name)

    def close(self) -> None:
        """Ask the child to close its engine and exit; terminate it if it does not within 30 s."""
        if self._closed:
            return
        self._closed = True
        if self._proc.is_alive() and self._failure is None:
            try:
                with self._lock:
                    self._conn.send((next(self._ids), "close", None))
            except (OSError, EOFError):
                pass
            self._proc.join(timeout=30)
        self._terminate()
        self._fail_pending(f"{self.engine_name} engine was closed")
        self._reader.join(timeout=10)
        self._conn.close()

    # plumbing

    def _check(self) -> None:
        if self._failure is not None:
            raise EngineError(self._failure)
        if self._closed:
            raise EngineError(f"{self.engine_name} engine is closed")

    async def _request(self, op: str, payload: Any) -> Any:
        self._check()
        future = asyncio.get_running_loop().create_future()
        with self._lock:
            request_id = next(self._ids)
            self._pending[request_id] = future
            try:
                self._conn.send((request_id, op, payload))
            except (OSError, EOFError, ValueError):
                self._pending.pop(request_id, None)
                raise EngineError(self._failure or f"{self.engine_name} engine process is gone "
                                  f"(exit code {self._proc.exitcode})") from None
        return await future

    def _read(self) -> None:
        while True:
            try:
                request_id, status, value, attrs = self._conn.recv()
            except (EOFError, OSError, ValueError):
                break
            self._mirror(attrs)
            with self._lock:
                future = self._pending.pop(request_id, None)
            if future is not None:
                _settle(future, status, value)
        if not self._closed:
            self._proc.join(timeout=5)
            self._failure = (f"{self.engine_name} engine process (pid {self._proc.pid}) exited with code "
                             f"{self._proc.exitcode}")
            self._fail_pending(self._failure)

    def _fail_pending(self, message: str) -> None:
        with self._lock:
            pending, self._pending = self._pending, {}
        for future in pending.values():
            _settle(future, "raise", EngineError(message))

    def _terminate(self) -> None:
        if self._proc.is_alive():
            self._proc.terminate()
            self._proc.join(timeout=10)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(timeout=10)


def _settle(future: asyncio.Future[Any], status: str, value: Any) -> None:
    def settle() -> None:
        if future.done():
            return
        if status == "ok":
            future.set_result(value)
        else:
            future.set_exception(value)

    try:
        future.get_loop().call_soon_threadsafe(settle)
    except RuntimeError:  # the caller's loop is closed: nobody is waiting
        pass


# ------------------------------------------------------------------------------------------ Ray actor


class RayEngineActor:
    """A Ray actor holding the engine; its coroutines run concurrently on the actor's event loop."""

    def __init__(self, engine_cls: Any, engine_config: Any, num_threads: int | None = None) -> None:
        if num_threads:
            import torch

            torch.set_num_threads(num_threads)
        self.engine = resolve_engine_class(engine_cls)(engine_config)

    def describe(self) -> dict[str, Any]:
        return _describe(self.engine)

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> tuple[GenerateOutput, dict[str, Any]]:
        return await self.engine.generate(prompt_ids, params), _mirrored(self.engine)

    async def update_weights(self, named_tensors: Any) -> tuple[None, dict[str, Any]]:
        return await self.engine.update_weights(named_tensors), _mirrored(self.engine)

    async def call(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        if name not in OPTIONAL_METHODS:
            raise EngineError(f"engine method {name!r} is not forwarded")
        result = getattr(self.engine, name)(*args, **kwargs)
        result = await result if asyncio.iscoroutine(result) else result
        return result, _mirrored(self.engine)

    async def get(self, name: str) -> Any:
        return getattr(self.engine, name)

    async def close(self) -> None:
        close = getattr(self.engine, "close", None)
        if callable(close):
            close()


def connect_ray(address: str | None = None, num_cpus: int | None = None) -> tuple[Any, bool]:
    """``(ray, owned)``: the Ray instance this process already runs, else the one
    :func:`skyrl_core.ray_cluster.connect` joins at ``address`` or starts (with ``num_cpus`` CPUs);
    ``owned`` says whether this call started it (its caller then shuts it down)."""
    try:
        import ray
    except ImportError:
        raise EngineError("trainer.engine_placement=ray needs Ray: pip install 'skyrl-trainers[ray]'") from None
    return ray, ray_cluster.connect(address, what="trainer.engine_placement=ray", num_cpus=num_cpus)


def start_engine_actor(ray: Any, engine_cls: Any, engine_config: Any, *, num_gpus: float = 0,
                       num_threads: int | None = None, **options: Any) -> Any:
    """A :class:`RayEngineActor` (1 CPU, plus ``num_gpus``; ``options`` such as a scheduling strategy go to
    ``.options``) that builds ``engine_cls(engine_config)``; it is ready once ``describe`` returns."""
    return ray.remote(RayEngineActor).options(num_cpus=1, num_gpus=num_gpus, max_concurrency=1000, **options).remote(
        class_path(engine_cls), engine_config, num_threads)


def cpu_state(named_tensors: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> dict[str, Any]:
    """The weights as a dict of detached CPU tensors (sharded ones gathered), ready for ``ray.put``."""
    items = named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors
    state = {}
    for name, value in items:
        if hasattr(value, "full_tensor"):
            value = value.full_tensor()
        state[name] = value.detach().cpu()
    return state


class RayEngine(RemoteEngineClient):
    """An engine in a Ray actor (1 CPU, plus ``num_gpus``), started on ``address`` or a local Ray that
    this client starts (and shuts down on ``close()``) when none is running; same conventions as the
    trainer's ``backend=ray`` ranks, which then join this Ray instance. :meth:`for_actor` fronts an actor
    started elsewhere (one replica of :class:`~.replicas.RayEngineReplicas`)."""

    def __init__(self, engine_cls: Any, engine_config: Any, *, address: str | None = None, num_gpus: float = 0,
                 num_cpus: int | None = None, num_threads: int | None = None, start_timeout: float = 600.0) -> None:
        ray, owned = connect_ray(address, num_cpus)
        self._attach(ray, start_engine_actor(ray, engine_cls, engine_config, num_gpus=num_gpus,
                                             num_threads=num_threads), engine_cls, owns_ray=owned)
        try:
            info = ray.get(self._actor.describe.remote(), timeout=start_timeout)
        except Exception as exc:  # noqa: BLE001 - construction errors surface here
            self._shutdown()
            raise EngineError(f"{self._what} failed to start in its Ray actor: {exc}") from None
        self._setup(engine_config, info)

    @classmethod
    def for_actor(cls, ray: Any, actor: Any, engine_cls: Any, engine_config: Any, info: dict[str, Any], *,
                  label: str | None = None, tokenizer: Any = None) -> RayEngine:
        """A client of ``actor`` (already started, ``info`` its ``describe()``); it does not own Ray, and
        ``label`` (e.g. ``"replica 1"``) names it in its errors."""
        self = cls.__new__(cls)
        self._attach(ray, actor, engine_cls, owns_ray=False, label=label)
        self._setup(engine_config, info, tokenizer)
        return self

    def _attach(self, ray: Any, actor: Any, engine_cls: Any, *, owns_ray: bool, label: str | None = None) -> None:
        self._ray, self._actor, self._owns_ray = ray, actor, owns_ray
        self.engine_name = class_path(engine_cls).rpartition(":")[2]
        self.label = label
        self._what = f"{self.engine_name} engine" + (f" {label}" if label else "")
        self._closed = False
        self._failure: str | None = None

    @property
    def failure(self) -> str | None:
        """Why the actor is unusable (it died), else None."""
        return self.__dict__.get("_failure")

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> GenerateOutput:
        return await self._call(self._actor.generate, list(prompt_ids), params)

    async def update_weights(self, named_tensors: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> None:
        """Put the weights (on CPU, gathered if sharded) in Ray's object store; returns once loaded."""
        await self.load_weights(self._ray.put(cpu_state(named_tensors)))

    async def load_weights(self, state_ref: Any) -> None:
        """Load weights already in Ray's object store (the ``ObjectRef`` of a :func:`cpu_state` dict)."""
        await self._call(self._actor.update_weights, state_ref)

    async def call_remote(self, name: str, *args: Any, **kwargs: Any) -> Any:
        return await self._call(self._actor.call, name, args, kwargs)

    async def remote_attr(self, name: str) -> Any:
        self._check()
        try:
            return await self._actor.get.remote(name)
        except self._ray.exceptions.RayActorError as exc:
            raise self._died(exc) from None

    async def _call(self, method: Any, *args: Any) -> Any:
        self._check()
        try:
            result, attrs = await method.remote(*args)
        except self._ray.exceptions.RayActorError as exc:
            raise self._died(exc) from None
        self._mirror(attrs)
        return result

    def _died(self, exc: BaseException) -> EngineError:
        self._failure = f"{self._what} Ray actor died: {exc}"
        return EngineError(self._failure)

    def _check(self) -> None:
        if self._failure is not None:
            raise EngineError(self._failure)
        if self._closed:
            raise EngineError(f"{self._what} is closed")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._failure is None:
            try:
                self._ray.get(self._actor.close.remote(), timeout=30)
            except Exception:  # noqa: BLE001 - it is killed below anyway
                pass
        self._shutdown()

    def _shutdown(self) -> None:
        try:
            self._ray.kill(self._actor)
        except Exception:  # noqa: BLE001
            pass
        ray_cluster.disconnect(self._owns_ray)
