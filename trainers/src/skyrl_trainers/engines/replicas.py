"""``engine.replicas=N``: N copies of the rollout engine, each in its own Ray actor, behind one client.

:class:`RayEngineReplicas` starts N :class:`~.remote.RayEngineActor` (one bundle each of a ``SPREAD``
placement group: 1 CPU, plus the engine's GPUs on CUDA, so each replica gets its own GPU and Ray spreads
them over the nodes it can) and talks to each through a :class:`~.remote.RayEngine` client. It is itself
an ``InferenceEngine``:

* ``generate`` routes each request (:class:`ReplicaRouter`): a request with ``SamplingParams.session_id``
  (the default generator sets it to the episode key, so every turn of an episode carries it) goes to the
  replica that served the session's first request, which was the least loaded one then, so a multi-turn
  episode stays where its context was computed; the session map is an LRU of ``max_sessions`` entries.
  Requests without a session go to the replica with the fewest requests in flight (ties: the one that
  was given the fewest so far). ``GenerateOutput.metadata["replica"]`` says which replica served it.
* ``update_weights`` puts the state in Ray's object store once and every replica loads that one object;
  updates run one at a time, so the replicas move through the same versions, and afterwards they must
  hold the same ``weight_version`` (else :class:`EngineError`). ``weight_version`` is that common
  version (the lowest one while an update is landing), ``in_flight_updates`` the engines' setting.
* ``release_memory`` / ``sleep`` / ``wake_up`` (where the engine has them) go to every replica.
* A replica whose actor dies is left out: its sessions move to live replicas and weight updates skip
  it (a warning says so). The requests it held, and any sent to it before its death was known, are sent
  again to a live replica: nothing of them reached the caller, and a request carries all the context
  it needs, so an episode goes on instead of being lost. With no live replica left every call fails
  with :class:`EngineError` naming the replicas. :meth:`replica_stats` (and
  :meth:`engine_metrics`, logged by the trainer each step) report requests served and failed per replica.

Replica ``i`` gets the engine config with ``seed + i`` (when it has an int ``seed``), so requests that
bring no seed of their own are not sampled identically by every replica.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

from skyrl_core import ray_cluster
from skyrl_core.engine import EngineError, GenerateOutput, SamplingParams

from skyrl_trainers.engines.remote import (
    RayEngine,
    RemoteEngineClient,
    class_path,
    connect_ray,
    cpu_state,
    start_engine_actor,
)

log = logging.getLogger(__name__)

#: Sessions whose replica the router remembers (least recently used forgotten first).
DEFAULT_MAX_SESSIONS = 4096


class ReplicaRouter:
    """Chooses the replica of each request and counts what each replica did. Thread-safe.

    :meth:`pick` returns the replica pinned to ``session_id`` when it is alive, else the live replica with
    the fewest requests in flight (ties: fewest routed so far, then the lowest index) and pins the session
    to it; it counts the request in flight until :meth:`finish`. At most ``max_sessions`` sessions are
    remembered (LRU), so a long run's map stays bounded.
    """

    def __init__(self, replicas: int, max_sessions: int = DEFAULT_MAX_SESSIONS) -> None:
        if replicas < 1 or max_sessions < 1:
            raise ValueError(f"need replicas >= 1 and max_sessions >= 1, got {replicas} and {max_sessions}")
        self.replicas, self.max_sessions = replicas, max_sessions
        self.in_flight = [0] * replicas
        self.routed = [0] * replicas
        self.served = [0] * replicas
        self.failed = [0] * replicas
        self.sessions: OrderedDict[str, int] = OrderedDict()
        self._lock = threading.Lock()

    def pick(self, session_id: str | None, alive: Sequence[bool]) -> int:
        with self._lock:
            live = [i for i in range(self.replicas) if alive[i]]
            if not live:
                raise EngineError("no live engine replica")
            index = self.sessions.get(session_id) if session_id is not None else None
            if index is None or not alive[index]:
                index = min(live, key=lambda i: (self.in_flight[i], self.routed[i], i))
                if session_id is not None:
                    self.sessions[session_id] = index
                    while len(self.sessions) > self.max_sessions:
                        self.sessions.popitem(last=False)
            if session_id is not None:
                self.sessions.move_to_end(session_id)
            self.in_flight[index] += 1
            self.routed[index] += 1
            return index

    def finish(self, index: int, served: bool | None) -> None:
        """A request on ``index`` ended: served, failed (``False``) or cancelled by its caller (``None``)."""
        with self._lock:
            self.in_flight[index] -= 1
            if served:
                self.served[index] += 1
            elif served is False:
                self.failed[index] += 1

    def forget(self, index: int) -> int:
        """Unpin the sessions of ``index`` (a dead replica); how many there were."""
        with self._lock:
            pinned = [s for s, i in self.sessions.items() if i == index]
            for session in pinned:
                del self.sessions[session]
            return len(pinned)

    def pinned(self, index: int) -> int:
        with self._lock:
            return sum(1 for i in self.sessions.values() if i == index)


def replica_config(engine_config: Any, index: int) -> Any:
    """The config replica ``index`` is built with: ``seed + index`` for a pydantic config with an int seed."""
    seed = getattr(engine_config, "seed", None)
    if index == 0 or not isinstance(seed, int) or isinstance(seed, bool) or not hasattr(engine_config, "model_copy"):
        return engine_config
    return engine_config.model_copy(update={"seed": seed + index})


class RayEngineReplicas(RemoteEngineClient):
    """``replicas`` copies of ``engine_cls(engine_config)`` as Ray actors behind one ``InferenceEngine``
    (see the module docstring). Joins the running Ray, else ``address``, else starts a local Ray with
    ``num_cpus`` CPUs that ``close()`` shuts down. Each replica takes 1 CPU plus ``num_gpus``."""

    def __init__(self, engine_cls: Any, engine_config: Any, replicas: int, *, address: str | None = None,
                 num_gpus: float = 0, num_cpus: int | None = None, num_threads: int | None = None,
                 start_timeout: float = 600.0, max_sessions: int = DEFAULT_MAX_SESSIONS) -> None:
        self._router = ReplicaRouter(replicas, max_sessions)
        self.engine_name = class_path(engine_cls).rpartition(":")[2]
        self._closed = False
        self._updating = 0
        self._update_lock: asyncio.Lock | None = None
        self._lost: set[int] = set()
        ray, self._owns_ray = connect_ray(address, num_cpus)
        self._ray, self._pg = ray, None
        actors: list[Any] = []
        try:
            self._pg = self._placement_group(replicas, num_gpus, start_timeout)
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

            actors = [start_engine_actor(ray, engine_cls, replica_config(engine_config, i), num_gpus=num_gpus,
                                         num_threads=num_threads,
                                         scheduling_strategy=PlacementGroupSchedulingStrategy(
                                             self._pg, placement_group_bundle_index=i))
                      for i in range(replicas)]
            infos = self._describe(actors, time.monotonic() + start_timeout)
        except BaseException:
            for actor in actors:
                try:
                    ray.kill(actor)
                except Exception:  # noqa: BLE001
                    pass
            self._release()
            raise
        self._setup(engine_config, infos[0])
        self.replicas = [RayEngine.for_actor(ray, actor, engine_cls, replica_config(engine_config, i), info,
                                             label=f"replica {i}", tokenizer=self.tokenizer)
                         for i, (actor, info) in enumerate(zip(actors, infos, strict=True))]

    # ------------------------------------------------------------------------------------- the protocol

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> GenerateOutput:
        self._check()
        while True:
            index = self._router.pick(params.session_id, self._alive())
            replica = self.replicas[index]
            try:
                out = await replica.generate(prompt_ids, params)
            except asyncio.CancelledError:
                self._router.finish(index, None)
                raise
            except BaseException:
                self._router.finish(index, False)
                self._note_death(index)
                if replica.failure is None or not any(self._alive()) or self._closed or not self._ray.is_initialized():
                    raise  # the request's own error, the last replica gone, or the client (or Ray) shut down
                continue  # its replica died under it: again, on a live one
            self._router.finish(index, True)
            out.metadata["replica"] = index
            return out

    async def update_weights(self, named_tensors: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> None:
        """Put the weights in Ray's object store once and load them into every live replica (one update
        at a time); raises :class:`EngineError` if the replicas then disagree on ``weight_version``."""
        if self._update_lock is None:
            self._update_lock = asyncio.Lock()
        async with self._update_lock:
            self._check()
            state_ref = self._ray.put(cpu_state(named_tensors))
            self._updating += 1
            try:
                await self._broadcast(lambda replica: replica.load_weights(state_ref))
            finally:
                self._updating -= 1
            self._agreed_version()

    async def call_remote(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """An optional engine method (``release_memory``, ``sleep``, ``wake_up``) on every live replica;
        the first replica's result."""
        return (await self._broadcast(lambda replica: replica.call_remote(name, *args, **kwargs)))[0]

    @property
    def weight_version(self) -> int:
        """The version every live replica holds (the lowest one while an update is landing)."""
        return self._agreed_version(landing_ok=True)

    # -------------------------------------------------------------------------------- for tests, metrics

    async def remote_attr(self, name: str) -> list[Any]:
        """An attribute of each replica's engine, in replica order (e.g. ``batch_sizes``)."""
        return list(await asyncio.gather(*(replica.remote_attr(name) for replica in self.replicas)))

    def replica_stats(self) -> list[dict[str, Any]]:
        """Per replica: ``alive``, requests ``in_flight``, ``routed``, ``served`` and ``failed``, sessions
        pinned to it, its ``weight_version`` and, when dead, its ``failure``."""
        router = self._router
        return [{"replica": i, "alive": replica.failure is None, "in_flight": router.in_flight[i],
                 "routed": router.routed[i], "served": router.served[i], "failed": router.failed[i],
                 "sessions": router.pinned(i), "weight_version": replica._attrs.get("weight_version"),
                 "failure": replica.failure}
                for i, replica in enumerate(self.replicas)]

    def engine_metrics(self) -> dict[str, float]:
        """``engine/replicas_alive`` and, per replica, requests served and failed so far (cumulative)."""
        metrics = {"engine/replicas_alive": float(sum(self._alive()))}
        for stats in self.replica_stats():
            metrics[f"engine/replica{stats['replica']}_requests"] = float(stats["served"])
            metrics[f"engine/replica{stats['replica']}_failed"] = float(stats["failed"])
        return metrics

    def close(self) -> None:
        """Close every replica's engine, end the actors and the placement group (and Ray, if started here)."""
        if self._closed:
            return
        self._closed = True
        for replica in self.replicas:
            replica.close()
        self._release()

    # ------------------------------------------------------------------------------------------ plumbing

    def _placement_group(self, replicas: int, num_gpus: float, timeout: float) -> Any:
        from ray.util.placement_group import placement_group

        ray = self._ray
        bundle = {"CPU": 1.0, **({"GPU": float(num_gpus)} if num_gpus else {})}
        total = ray.cluster_resources()
        short = {k: v * replicas for k, v in bundle.items() if total.get(k, 0.0) < v * replicas}
        if short:
            raise EngineError(f"engine.replicas={replicas} needs {replicas} x {bundle} on Ray, but the cluster has "
                              f"{ {k: total.get(k, 0.0) for k in bundle} }; lower engine.replicas or add nodes")
        group = placement_group([bundle] * replicas, strategy="SPREAD")
        try:
            ray.get(group.ready(), timeout=timeout)
        except Exception as exc:  # noqa: BLE001 - a timeout, or Ray failing to place it
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(group)
            raise EngineError(f"engine.replicas={replicas}: Ray did not place {replicas} x {bundle} within "
                              f"{timeout:.0f}s ({type(exc).__name__}); available: "
                              f"{ray.available_resources()}") from None
        return group

    def _describe(self, actors: list[Any], deadline: float) -> list[dict[str, Any]]:
        refs = [actor.describe.remote() for actor in actors]
        infos = []
        for i, ref in enumerate(refs):
            try:
                infos.append(self._ray.get(ref, timeout=max(deadline - time.monotonic(), 1.0)))
            except Exception as exc:  # noqa: BLE001 - construction errors surface here
                raise EngineError(f"{self.engine_name} engine replica {i} failed to start in its Ray actor: "
                                  f"{exc}") from None
        return infos

    def _alive(self) -> list[bool]:
        return [replica.failure is None for replica in self.replicas]

    def _live(self) -> list[int]:
        live = [i for i, alive in enumerate(self._alive()) if alive]
        if not live:
            failures = "; ".join(f"replica {i}: {r.failure}" for i, r in enumerate(self.replicas))
            raise EngineError(f"all {len(self.replicas)} {self.engine_name} engine replicas are dead ({failures})")
        return live

    def _check(self) -> None:
        if self._closed:
            raise EngineError(f"{self.engine_name} engine replicas are closed")
        self._live()

    def _note_death(self, index: int) -> None:
        """Once per replica that died: unpin its sessions and say so."""
        failure = self.replicas[index].failure
        if failure is None or index in self._lost:
            return
        self._lost.add(index)
        moved = self._router.forget(index)
        log.warning("%s; %d of %d replicas remain (its %d sessions move to them; weight updates skip it)",
                    failure, sum(self._alive()), len(self.replicas), moved)

    async def _broadcast(self, call: Callable[[RayEngine], Awaitable[Any]]) -> list[Any]:
        """``call`` on every live replica at once; results of those that are still alive, in replica order.
        A replica that dies meanwhile is left out (a warning); any other error is raised."""
        live = self._live()
        results = await asyncio.gather(*(call(self.replicas[i]) for i in live), return_exceptions=True)
        kept, errors = [], []
        for i, result in zip(live, results, strict=True):
            if isinstance(result, BaseException):
                self._note_death(i)
                if self.replicas[i].failure is None or isinstance(result, asyncio.CancelledError):
                    errors.append(result)
            else:
                kept.append(result)
        if errors:
            raise errors[0]
        if not kept:
            self._live()  # every replica died: raises
        return kept

    def _agreed_version(self, landing_ok: bool = False) -> int:
        versions = {i: self.replicas[i]._attrs.get("weight_version") for i in self._live()}
        if any(v is None for v in versions.values()):
            raise AttributeError(f"{self.engine_name} engine has no weight_version")
        distinct = set(versions.values())
        if len(distinct) == 1:
            return distinct.pop()
        if landing_ok and self._updating:
            return min(distinct)
        raise EngineError(f"{self.engine_name} engine replicas disagree on weight_version "
                          f"({', '.join(f'replica {i}: {v}' for i, v in versions.items())}); a weight update "
                          "reached only some of them")

    def _release(self) -> None:
        if self._pg is not None:
            from ray.util.placement_group import remove_placement_group

            try:
                remove_placement_group(self._pg)
            except Exception:  # noqa: BLE001
                pass
            self._pg = None
        if self._owns_ray:
            self._owns_ray = False
            ray_cluster.disconnect(True)
