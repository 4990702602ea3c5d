"""Groups of trainer ranks: in-process, spawned processes, or Ray actors, all running :class:`TrainWorker`.

``group.call(method, *args)`` runs ``TrainWorker.method(*args)`` on every rank at once (the methods are
collectives) and returns the per-rank results; ``per_rank=[...]`` gives each rank its own argument.
A rank that fails stops the whole group with that rank's traceback instead of leaving the others
blocked in a collective.
"""

from __future__ import annotations

import socket
import sys
import traceback
from collections.abc import Sequence
from typing import Any, Protocol

import torch
from skyrl_core import ray_cluster
from skyrl_core.factory import ConfigError
from skyrl_core.notice import quiet_progress_bars

from skyrl_trainers.worker import TrainWorker, WorkerSpec, resolve_device, worker_threads


class WorkerError(RuntimeError):
    """A trainer rank raised; the message carries its traceback."""


class WorkerGroup(Protocol):
    world_size: int

    def call(self, method: str, *args: Any, per_rank: Sequence[Any] | None = None) -> list[Any]: ...

    def close(self) -> None: ...


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


SAVING = ("export", "save_checkpoint")
"""Worker methods that write Hugging Face folders: they run without progress bars (transformers' ``Writing
model shards`` bar came on every run)."""


def _invoke(worker: TrainWorker, method: str, args: tuple[Any, ...]) -> Any:
    if method in SAVING:
        with quiet_progress_bars():
            return getattr(worker, method)(*args)
    return getattr(worker, method)(*args)


def _args(args: tuple[Any, ...], per_rank: Sequence[Any] | None, rank: int) -> tuple[Any, ...]:
    return (per_rank[rank], *args) if per_rank is not None else args


class LocalWorkerGroup:
    """World size 1 in the driver's own process."""

    world_size = 1

    def __init__(self, spec: WorkerSpec) -> None:
        hook = sys.excepthook
        try:
            self.worker = TrainWorker(0, 1, "127.0.0.1", free_port(), spec)
        finally:  # torch's init_process_group makes every later traceback line start with "[rank0]: "
            sys.excepthook = hook

    def call(self, method: str, *args: Any, per_rank: Sequence[Any] | None = None) -> list[Any]:
        return [_invoke(self.worker, method, _args(args, per_rank, 0))]

    def close(self) -> None:
        self.worker.close()


def _serve(rank: int, world_size: int, port: int, spec: WorkerSpec, conn: Any) -> None:
    """Body of a spawned rank: build the worker, then answer ``(method, args)`` requests until closed."""
    torch.set_num_threads(worker_threads(world_size))
    try:
        worker = TrainWorker(rank, world_size, "127.0.0.1", port, spec)
        conn.send(("ok", None))
    except BaseException:  # noqa: BLE001 - reported to the driver
        conn.send(("error", traceback.format_exc()))
        return
    while True:
        method, args = conn.recv()
        try:
            result = _invoke(worker, method, args)
            conn.send(("ok", result))
        except BaseException:  # noqa: BLE001
            conn.send(("error", traceback.format_exc()))
            continue
        if method == "close":
            return


_SPAWN_HINT = ("Ranks are spawned processes that re-import the main module: a training script must call "
               "fit() under `if __name__ == \"__main__\":`.")


class ProcessWorkerGroup:
    """``world_size`` ranks as spawned processes on this machine (torch.multiprocessing)."""

    def __init__(self, spec: WorkerSpec, world_size: int) -> None:
        import torch.multiprocessing as mp

        ctx = mp.get_context("spawn")
        self.world_size = world_size
        port = free_port()
        self.conns, self.procs = [], []
        for rank in range(world_size):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_serve, args=(rank, world_size, port, spec, child), daemon=True,
                               name=f"skyrl-trainer-rank{rank}")
            proc.start()
            self.conns.append(parent)
            self.procs.append(proc)
        self._collect("startup")

    def call(self, method: str, *args: Any, per_rank: Sequence[Any] | None = None) -> list[Any]:
        for rank, conn in enumerate(self.conns):
            conn.send((method, _args(args, per_rank, rank)))
        return self._collect(method)

    def _collect(self, what: str) -> list[Any]:
        from multiprocessing.connection import wait

        results: dict[int, Any] = {}
        pending = dict(enumerate(self.conns))
        while pending:
            ready = wait(list(pending.values()), timeout=5.0)
            for rank, conn in list(pending.items()):
                if conn in ready:
                    try:
                        status, value = conn.recv()
                    except EOFError:
                        self.procs[rank].join(timeout=5)
                        status, value = "error", f"rank {rank} exited (code {self.procs[rank].exitcode}). {_SPAWN_HINT}"
                    if status == "error":
                        self.terminate()
                        raise WorkerError(f"trainer rank {rank} failed during {what}:\n{value}")
                    results[rank] = value
                    del pending[rank]
                elif not self.procs[rank].is_alive():
                    self.terminate()
                    raise WorkerError(f"trainer rank {rank} died during {what} (exit code {self.procs[rank].exitcode})")
        return [results[r] for r in range(self.world_size)]

    def terminate(self) -> None:
        for proc in self.procs:
            if proc.is_alive():
                proc.terminate()
        for proc in self.procs:
            proc.join(timeout=10)

    def close(self) -> None:
        try:
            self.call("close")
            for proc in self.procs:
                proc.join(timeout=30)  # let ranks exit on their own before anything is killed
        finally:
            self.terminate()


class RayRank:
    """A Ray actor holding one :class:`TrainWorker`."""

    def address(self) -> tuple[str, int]:
        import ray

        return ray.util.get_node_ip_address(), free_port()

    def start(self, rank: int, world_size: int, addr: str, port: int, spec: WorkerSpec) -> None:
        torch.set_num_threads(1)
        self.worker = TrainWorker(rank, world_size, addr, port, spec)

    def call(self, method: str, args: tuple[Any, ...]) -> Any:
        return _invoke(self.worker, method, args)


class RayWorkerGroup:
    """Ranks as Ray actors, one per bundle of a placement group (1 CPU, plus 1 GPU on CUDA)."""

    def __init__(self, spec: WorkerSpec, world_size: int, address: str | None = None, use_gpu: bool = False) -> None:
        try:
            import ray
            from ray.util.placement_group import placement_group, remove_placement_group
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
        except ImportError:
            raise RuntimeError("trainer.backend=ray needs Ray: pip install 'skyrl-trainers[ray]'") from None
        self._ray, self._remove_pg = ray, remove_placement_group
        self.world_size = world_size
        self._owns_ray = not ray.is_initialized()
        if self._owns_ray:
            ray.init(address=address, include_dashboard=False, log_to_driver=True,
                     **({} if address else {"num_cpus": world_size}))
        bundle = {"CPU": 1, **({"GPU": 1} if use_gpu else {})}
        self.pg = placement_group([bundle] * world_size, strategy="PACK")
        ray.get(self.pg.ready(), timeout=180)
        actor_cls = ray.remote(RayRank)
        self.actors = [actor_cls.options(
            num_cpus=1, num_gpus=1 if use_gpu else 0,
            scheduling_strategy=PlacementGroupSchedulingStrategy(self.pg, placement_group_bundle_index=rank),
        ).remote() for rank in range(world_size)]
        addr, port = ray.get(self.actors[0].address.remote())
        self._get([a.start.remote(r, world_size, addr, port, spec) for r, a in enumerate(self.actors)], "startup")

    def _get(self, refs: list[Any], what: str) -> list[Any]:
        try:
            return self._ray.get(refs)
        except self._ray.exceptions.RayError as exc:
            self.terminate()
            raise WorkerError(f"a Ray trainer rank failed during {what}:\n{exc}") from None

    def call(self, method: str, *args: Any, per_rank: Sequence[Any] | None = None) -> list[Any]:
        refs = [a.call.remote(method, _args(args, per_rank, r)) for r, a in enumerate(self.actors)]
        return self._get(refs, method)

    def terminate(self) -> None:
        for actor in self.actors:
            self._ray.kill(actor)
        self._remove_pg(self.pg)
        ray_cluster.disconnect(self._owns_ray)

    def close(self) -> None:
        try:
            self.call("close")
        finally:
            self.terminate()


def make_worker_group(spec: WorkerSpec) -> WorkerGroup:
    """The ranks for ``spec.config``: Ray actors, the driver process alone, or spawned processes."""
    cfg = spec.config
    on_gpu = resolve_device(cfg.device) == "cuda"
    if cfg.backend == "ray":
        return RayWorkerGroup(spec, cfg.world_size, cfg.ray_address, use_gpu=on_gpu)
    if on_gpu and cfg.world_size > torch.cuda.device_count():
        raise ConfigError(f"trainer.world_size={cfg.world_size} but {torch.cuda.device_count()} CUDA device(s) are "
                          "visible; each rank needs its own GPU (or use trainer.backend=ray on a cluster)")
    if cfg.world_size == 1:
        return LocalWorkerGroup(spec)
    return ProcessWorkerGroup(spec, cfg.world_size)
