"""Env workers on Ray, seen from the generator: a pool of :class:`~skyrl_core.env_workers.EnvWorker`
actors and the :class:`RemoteEnv` that stands in for one env living in one of them.

Placement: every worker asks Ray for the custom resources its env declares
(:meth:`TextEnv.ray_resources`, e.g. ``{"docker": 1}``) and is pinned to a live node that offers CPU
(a worker runs the env's Python; a head started with ``--num-cpus 0`` hosts none) and advertises
them (``ray start --resources "$(skyrl node-resources)"``): the one with room that hosts the fewest of
the pool's workers for its size (ties: the lowest node id), so workers spread over the nodes. A worker
reserves no CPU (``num_cpus=0``, unless the env's resources name ``CPU``), so env workers never hold
back an engine or trainer actor that asks for all of a node's cores. A worker hosts up to
``envs_per_worker`` envs; the pool starts workers as episodes need them, up to ``max_env_workers`` and
to what the nodes offer, and an episode waits for a free slot beyond that.

Faults: a worker whose actor or node dies, or that does not answer a call within ``env_call_timeout``
seconds, is *lost*: it is killed and dropped, each episode it hosted raises :class:`EnvWorkerLost` (the
generator plays it again on another worker), later episodes get new workers, and every live node sweeps
the orphans that workers left behind (containers, sandboxes; hook ``sweep_orphans``).
"""

from __future__ import annotations

import asyncio
import logging
import math
import pickle
import re
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from skyrl_core.env import StepResult, TextEnv
from skyrl_core.factory import ConfigError
from skyrl_core.ray_cluster import require_ray

log = logging.getLogger(__name__)

#: ``Trajectory.stop_reason`` of an episode whose env worker was lost.
WORKER_LOST = "env_worker_lost"
#: Seconds no new worker is placed on a node after one of its workers was lost.
SUSPECT_SECONDS = 30.0


class EnvWorkerLost(RuntimeError):
    """The env worker hosting an episode died, its node went away, or it stopped answering."""

    stop_reason = WORKER_LOST


class EnvWorkerError(RuntimeError):
    """An env worker could not be started where it was placed (its env class or config failed to load there)."""


class _Worker:
    """The pool's record of one actor: its leases and, once it answered, where it runs."""

    def __init__(self, actor: Any, ready: Any, number: int, node_id: str) -> None:
        self.actor, self.ready, self.number, self.node_id = actor, ready, number, node_id
        self.leases = 0
        self.pid: int | None = None
        self.lost: str | None = None

    def __repr__(self) -> str:
        return f"env worker {self.number} (node {self.node_id[:12]}, pid {self.pid or '?'})"


class RayEnvPool:
    """Env workers for one env class and config, placed on Ray by the env's declared resources."""

    def __init__(self, env_cls: type[TextEnv], env_config: Any, *, envs_per_worker: int = 8,
                 max_workers: int = 16, resources: Mapping[str, float] | None = None,
                 call_timeout: float = 900.0, start_timeout: float = 300.0) -> None:
        self.ray = require_ray("generator.env_placement=ray")
        if not self.ray.is_initialized():
            from skyrl_core.ray_cluster import connect

            connect(what="generator.env_placement=ray")
        self.env_cls, self.env_config = env_cls, env_config
        self.envs_per_worker, self.max_workers = envs_per_worker, max_workers
        self.resources = dict(env_cls.ray_resources(env_config) if resources is None else resources)
        self.call_timeout, self.start_timeout = call_timeout, start_timeout
        self.workers: list[_Worker] = []
        self.workers_lost = 0
        self.started = 0
        self._waiters: list[asyncio.Future[None]] = []
        # one sweeper thread at a time: a node that dies loses all its workers at once, and one more pass after
        # the latest loss covers them all (``_sweep_wanted`` asks the running thread for that pass)
        self._sweeper: threading.Thread | None = None
        self._sweep_wanted = False
        # node -> until when no worker is placed there: a node whose worker was just lost may be dying
        # while Ray still lists it as alive (its health checks take a while to fail)
        self._suspect: dict[str, float] = {}
        self.closed = False
        self.start_error: str | None = None  # set once a worker's __init__ raised: every later episode fails fast
        self._check_cluster()

    # -- placement ----------------------------------------------------------------------------

    def _live_nodes(self) -> list[dict[str, Any]]:
        """The cluster's live nodes, by node id (the order placement breaks ties in, whatever Ray lists first)."""
        return sorted((node for node in self.ray.nodes() if node.get("Alive")), key=lambda node: node["NodeID"])

    def _node_slots(self) -> dict[str, int]:
        """Env workers each live node can host (:func:`_worker_slots`), for the nodes that can host any and
        are not suspect, by node id."""
        now = time.monotonic()
        slots = {node["NodeID"]: _worker_slots(node.get("Resources", {}), self.resources, self.max_workers)
                 for node in self._live_nodes()}
        return {node: count for node, count in slots.items() if count > 0 and self._suspect.get(node, 0.0) <= now}

    def _check_cluster(self) -> None:
        if not self._node_slots():
            raise ConfigError(self._placement_problem())

    def _placement_problem(self) -> str:
        """Why no live node can host an env worker: no node offers CPU, or none with CPU offers the resources."""
        offered = [node.get("Resources", {}) for node in self._live_nodes()]
        with_cpu = [have for have in offered if _offers_cpu(have)]
        if not with_cpu:
            return (f"no live node of the Ray cluster offers CPU, and an env worker runs the env's Python on its node "
                    f"(a head started with `ray start --head --num-cpus 0` hosts none; cluster: "
                    f"{_show(_total(offered))}): join a node with CPUs, `ray start --address=HEAD:6379 --resources "
                    f"\"$(skyrl node-resources)\"`")
        without_cpu = [have for have in offered if not _offers_cpu(have)]
        aside = f"; nodes without CPU, which host no env workers: {_show(_total(without_cpu))}" if without_cpu else ""
        return (f"env {self.env_cls.__name__} needs Ray resources {_show(self.resources)} per env worker but no live "
                f"node of the cluster offers them together with CPU (nodes with CPU: {_show(_total(with_cpu))}{aside}); "
                f"start nodes with `ray start --resources \"$(skyrl node-resources)\"`, or set generator.env_resources")

    def _start_worker(self) -> _Worker | None:
        """A new worker on the live node with room that hosts the fewest of ours, or ``None`` when none has room."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from skyrl_core.env_workers import EnvWorker

        used: dict[str, int] = {}
        for worker in self.workers:
            used[worker.node_id or ""] = used.get(worker.node_id or "", 0) + 1
        room = {node: slots for node, slots in self._node_slots().items() if used.get(node, 0) < slots}
        if not room:
            return None
        node = min(room, key=lambda n: (used.get(n, 0) / room[n], used.get(n, 0), n))
        self.started += 1
        actor = self.ray.remote(EnvWorker).options(
            **_ray_request(self.resources), max_restarts=0, max_concurrency=max(64, 4 * self.envs_per_worker),
            scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
        ).remote(self.env_cls, self.env_config)
        worker = _Worker(actor, actor.describe.remote(), self.started, node)
        self.workers.append(worker)
        return worker

    async def lease(self) -> _Worker:
        """A worker with a free env slot (the least loaded), starting one where a live node has room.

        Raises :class:`EnvWorkerLost` when no worker is left and no live node can host one (e.g. the only
        nodes offering the env's resources died), instead of waiting for a node that may never come.
        """
        while True:
            if self.closed:
                raise EnvWorkerLost("the env worker pool was closed")
            if self.start_error is not None:
                raise EnvWorkerError(self.start_error)
            open_ = [w for w in self.workers if w.lost is None and w.leases < self.envs_per_worker]
            worker = min(open_, key=lambda w: w.leases) if open_ else None
            if worker is None and len(self.workers) < self.max_workers:
                worker = self._start_worker()
            if worker is None and not self.workers:
                if any(deadline > time.monotonic() for deadline in self._suspect.values()):
                    await asyncio.sleep(1.0)  # only nodes that just lost a worker: wait until they are dead or clear
                    continue
                raise EnvWorkerLost(self._placement_problem())
            if worker is None:
                waiter = asyncio.get_running_loop().create_future()
                self._waiters.append(waiter)
                await waiter
                continue
            worker.leases += 1
            if worker.leases < self.envs_per_worker:
                self._wake()  # a worker just started (or freed) may have room for another waiting episode
            return worker

    def release(self, worker: _Worker) -> None:
        worker.leases -= 1
        self._wake()

    def _wake(self) -> None:
        while self._waiters:
            waiter = self._waiters.pop(0)
            if not waiter.done():
                waiter.get_loop().call_soon_threadsafe(_resolve, waiter)
                return

    # -- calls ----------------------------------------------------------------------------------

    async def call(self, worker: _Worker, method: str, *args: Any) -> Any:
        """``worker.method(*args)``; a worker that is dead, gone with its node or silent raises :class:`EnvWorkerLost`."""
        if worker.lost is not None or self.closed:
            raise EnvWorkerLost(f"{worker!r} was lost: {worker.lost or 'the pool was closed'}")
        if worker.pid is None:
            worker.pid = (await self._await(worker, worker.ready, self.start_timeout, "start"))["pid"]
        return await self._await(worker, getattr(worker.actor, method).remote(*args), self.call_timeout, method)

    async def _await(self, worker: _Worker, ref: Any, timeout: float, what: str) -> Any:
        try:
            return await asyncio.wait_for(asyncio.wrap_future(ref.future()), timeout)
        except asyncio.TimeoutError:
            reason = f"no answer to {what} within {timeout:g} s"
        except self.ray.exceptions.RayTaskError as exc:  # the env's own code raised: the episode's error
            raise exc.as_instanceof_cause() from None
        except self.ray.exceptions.RayActorError as exc:
            if getattr(exc, "actor_init_failed", False):  # the env class or its config does not load there: no retry
                self.start_error = f"env workers fail to start: {_plain(str(exc))}"
                if worker in self.workers:
                    self.workers.remove(worker)
                raise EnvWorkerError(self.start_error) from None
            reason = f"{type(exc).__name__} during {what}: {_first_sentence(str(exc))}"
        except self.ray.exceptions.RayError as exc:
            reason = f"{type(exc).__name__} during {what}: {_first_sentence(str(exc))}"
        self.lose(worker, reason)
        raise EnvWorkerLost(f"{worker!r} was lost: {reason}")

    def lose(self, worker: _Worker, reason: str) -> None:
        """Drop ``worker`` (killing its actor), let waiting episodes start new workers, sweep the nodes."""
        if worker.lost is not None:
            return
        worker.lost = reason
        if self.closed:  # the pool killed it on close(): episodes still finishing just find it gone
            return
        self.workers_lost += 1
        self._suspect[worker.node_id] = time.monotonic() + SUSPECT_SECONDS
        if worker in self.workers:
            self.workers.remove(worker)
        log.warning("%r lost (%s); its episodes are played again on other workers", worker, reason)
        try:
            self.ray.kill(worker.actor, no_restart=True)
        except Exception:  # noqa: BLE001 - already gone
            pass
        self._wake()
        self._sweep_wanted = True
        if self._sweeper is None or not self._sweeper.is_alive():
            self._sweeper = threading.Thread(target=self._sweep_quietly, name="skyrl-env-sweep", daemon=True)
            self._sweeper.start()

    def _sweep_quietly(self) -> None:
        try:
            while self._sweep_wanted:
                self._sweep_wanted = False
                self.sweep_nodes()
        except BaseException as exc:  # noqa: BLE001 - Ray shut down under the thread (it raises SystemExit)
            log.info("orphan sweep stopped: %s", exc)

    def sweep_nodes(self, timeout: float = 120.0) -> dict[str, dict[str, int]]:
        """Run the orphan sweep (hook ``sweep_orphans``) once on every live node that offers CPU (no env worker
        runs on the others, so they have nothing to sweep); what each removed, by node id."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from skyrl_core.env_workers import sweep_node

        task = self.ray.remote(sweep_node)
        refs = [task.options(num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
                             ).remote() for node in self._live_nodes() if _offers_cpu(node.get("Resources", {}))]
        results: dict[str, dict[str, int]] = {}
        for ref in refs:
            try:
                answer = self.ray.get(ref, timeout=timeout)
            except Exception as exc:  # noqa: BLE001 - a node that died meanwhile sweeps when a worker starts there
                log.info("orphan sweep on a node failed: %s", _first_sentence(str(exc)))
                continue
            results[answer["node_id"]] = answer["swept"]
            if any(answer["swept"].values()):
                log.info("node %s: swept %s", answer["node_id"][:12], answer["swept"])
        return results

    def stats(self) -> dict[str, float]:
        return {"ray/env_workers": float(len(self.workers)), "ray/workers_lost_total": float(self.workers_lost)}

    def close(self) -> None:
        """Kill every worker (their envs were closed by their episodes), then sweep once more."""
        self.closed = True
        for worker in list(self.workers):
            try:
                self.ray.kill(worker.actor, no_restart=True)
            except Exception:  # noqa: BLE001
                pass
        self.workers.clear()
        if self._sweeper is not None:
            self._sweeper.join(timeout=130)
        if self.workers_lost and self.ray.is_initialized():
            self.sweep_nodes()


class RemoteEnv:
    """Stands in, in the generator, for one env that lives in a worker of a :class:`RayEnvPool`: the same
    :class:`~skyrl_core.env.EpisodeEnv` as a local env, each call made on the worker.

    Set ``subcall_handler`` (as on the env itself) to answer the env's sub-calls here; the env's steps
    then pause at each sub-call until the handler's answer is sent back.
    """

    def __init__(self, pool: RayEnvPool, task: Mapping[str, Any]) -> None:
        self.pool, self.task = pool, dict(task)
        self.key = uuid.uuid4().hex
        self.worker: _Worker | None = None
        self.subcall_handler: Callable[[str, dict[str, Any]], Awaitable[Any]] | None = None

    @property
    def node_id(self) -> str | None:
        return self.worker.node_id if self.worker is not None else None

    async def areset(self, *, seed: int | None = None,
                     options: Mapping[str, Any] | None = None) -> tuple[list[dict[str, str]], dict[str, Any]]:
        task = dict((options or {}).get("task", self.task))
        self.worker = await self.pool.lease()
        return await self.pool.call(self.worker, "reset", self.key, task, seed, self.subcall_handler is not None)

    async def astep(self, action: str) -> StepResult:
        assert self.worker is not None, "reset the env first"
        event = await self.pool.call(self.worker, "step", self.key, action)
        while event[0] == "call":
            _, call_id, method, params = event
            answer, error = None, None
            try:
                answer = await self.subcall_handler(method, params) if self.subcall_handler else None
            except Exception as exc:  # noqa: BLE001 - raised inside the env, where a local handler's would be
                error = _portable(exc)
            event = await self.pool.call(self.worker, "answer", self.key, call_id, answer, error)
        return StepResult(*event[1])

    async def afinish(self) -> dict[str, float]:
        """The env's metrics, and close it on its worker; ``{}`` when the worker is gone."""
        worker, self.worker = self.worker, None
        if worker is None:
            return {}
        try:
            return await self.pool.call(worker, "finish", self.key)
        except Exception as exc:  # noqa: BLE001 - a lost worker's envs went with it (and its node is swept)
            log.debug("finish of env %s on %r failed: %s", self.key, worker, exc)
            return {}
        finally:
            self.pool.release(worker)


def _worker_slots(offered: Mapping[str, float], needs: Mapping[str, float], most: int) -> int:
    """How many env workers needing ``needs`` a node offering ``offered`` (its Ray resources) can host: none
    without CPU, else the fewest of ``offered // amount`` over the needs (``most`` when there are none)."""
    if not _offers_cpu(offered):
        return 0
    counts = [math.floor(float(offered.get(name, 0.0)) / amount) for name, amount in needs.items() if amount > 0]
    return min(counts) if counts else most


def _offers_cpu(offered: Mapping[str, float]) -> bool:
    return float(offered.get("CPU", 0.0)) > 0


def _ray_request(needs: Mapping[str, float]) -> dict[str, Any]:
    """Ray options asking for ``needs``: ``CPU`` and ``GPU`` go in ``num_cpus``/``num_gpus`` (Ray refuses them
    among custom resources), the rest in ``resources``; no CPU is reserved unless ``needs`` names it."""
    custom = {name: amount for name, amount in needs.items() if name not in ("CPU", "GPU")}
    return {"num_cpus": needs.get("CPU", 0), "num_gpus": needs.get("GPU", 0), "resources": custom}


def _total(offered: list[Mapping[str, float]]) -> dict[str, float]:
    """The sum of several nodes' resources."""
    total: dict[str, float] = {}
    for have in offered:
        for name, amount in have.items():
            total[name] = total.get(name, 0.0) + float(amount)
    return total


def _portable(exc: Exception) -> Exception:
    """``exc`` itself when it pickles (to be raised in the worker), else a ``RuntimeError`` that names it."""
    try:
        pickle.dumps(exc)
        return exc
    except Exception:  # noqa: BLE001
        return RuntimeError(f"{type(exc).__name__}: {exc}")


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _plain(text: str) -> str:
    """``text`` without terminal colour codes (Ray colours the names in its tracebacks)."""
    return re.sub(r"\x1b\[[0-9;]*m", "", text).strip()


def _first_sentence(text: str, limit: int = 200) -> str:
    first = text.strip().splitlines()[0] if text.strip() else ""
    first = first.split(". ", 1)[0]
    return first if len(first) <= limit else first[: limit - 3] + "..."


def _show(resources: Mapping[str, float]) -> str:
    shown = {k: v for k, v in resources.items()
             if not k.startswith(("node:", "accelerator_type")) and k not in ("memory", "object_store_memory")}
    return ", ".join(f"{k}={v:g}" for k, v in sorted(shown.items())) or "nothing"
