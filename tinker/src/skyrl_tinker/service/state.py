"""What every resource of the service shares: the server's stores and registries, who owns what in them, how
much one tenant may hold, and letting go of what a session held.

Tenants (:mod:`skyrl_tinker.tenants`): sessions, models, sampling sessions and futures record their tenant,
runs record it in ``run.json``, and an object of another tenant is answered exactly as an unknown id is
(404), whatever the request does with it. The one exception is a checkpoint its owner published: any tenant
may load it, sample it and read its ``weights_info`` (never list its run, delete or publish it). Ids are
random (128 bits). A tenant past one of its :class:`~skyrl_tinker.tenants.Limits` gets a 429 naming the limit.
"""

from __future__ import annotations

import itertools
import secrets
import threading
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

from skyrl_core.http_hygiene import shown

from skyrl_tinker.backend import AdapterSpec, Backend
from skyrl_tinker.checkpoints import CheckpointError, CheckpointStore, TinkerPath
from skyrl_tinker.futures import Future, FutureStore
from skyrl_tinker.sampler import Sampler, SamplerWeights
from skyrl_tinker.seeds import ServerSeeds
from skyrl_tinker.sessions import Session, SessionRegistry
from skyrl_tinker.tenants import Limits
from skyrl_tinker.worker import Job, TrainWorker

# The client retries a 429 with backoff (for up to five minutes): a full queue drains, so let it; a
# tenant's sessions or models stay until it lets go of some, so tell it not to.
RETRY_SOON = {"retry-after": "1"}
DO_NOT_RETRY = {"x-should-retry": "false"}


class RequestError(Exception):
    """What was wrong with a request, as the HTTP status and message it is answered with."""

    def __init__(self, status: int, message: str, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = dict(headers or {})


@dataclass
class ModelInfo:
    model_id: str
    run_id: str  # where its checkpoints go: the model id itself, except for a model created by a load
    tenant: str
    session_id: str
    spec: AdapterSpec
    sampler_seq: int = 0


@dataclass
class SamplingSession:
    sampling_session_id: str
    tenant: str
    session_id: str
    weights: SamplerWeights
    model_path: str | None
    last_used: int = 0  # a tick of the service's clock: when it was opened or last sampled
    samples: list[Future] = field(default_factory=list)  # its samples still in the future store (at the last look)

    def busy(self, futures: FutureStore) -> bool:
        """Whether a sample of it is queued, running, or done but not yet collected: the client acknowledges
        what it fetched (``retrieve_futures``), which drops the future. Closing it would fail its poll."""
        self.samples = [f for f in self.samples if futures.get(f.request_id) is f]
        return bool(self.samples)


class ServerState:
    """The stores, registries and queues every resource reads and changes, and the checks they share."""

    def __init__(self, backend: Backend, sampler: Sampler, checkpoints: CheckpointStore,
                 sessions: SessionRegistry, futures: FutureStore, limits: Limits | None = None,
                 seeds: ServerSeeds | None = None) -> None:
        self.backend = backend
        self.seeds = seeds
        self.sampler = sampler
        self.checkpoints = checkpoints
        self.sessions = sessions
        self.futures = futures
        self.limits = limits or Limits()
        self.worker = TrainWorker(backend, futures)
        self.models: dict[str, ModelInfo] = {}
        self.sampling: dict[str, SamplingSession] = {}
        self._sampling_lock = threading.Lock()  # opened by routes and the training worker, closed by both
        self._ticks = itertools.count(1)
        self.base_weights = SamplerWeights("base", {})
        # a checkpoint's weights by key, loaded once for every sampling session and sample that uses them,
        # dropped with the last one
        self.loaded_weights: weakref.WeakValueDictionary[str, SamplerWeights] = weakref.WeakValueDictionary()

    def check_base(self, base_model: str | None) -> None:
        if base_model not in (None, self.backend.base_model_name, self.backend.tokenizer_source):
            raise RequestError(400, f"base model {shown(base_model)} is not served here; this server serves "
                                    f"{self.backend.base_model_name!r} (skyrl-tinker serve --base-model)")

    # --- what a tenant owns, and how much ----------------------------------------------------------

    def session(self, tenant: str, session_id: str) -> Session:
        return owned(self.sessions.get(session_id), tenant, f"unknown or expired session {shown(session_id)} "
                                                               "(sessions end when heartbeats stop)")

    def model(self, tenant: str, model_id: str) -> ModelInfo:
        return owned(self.models.get(model_id), tenant,
                     f"unknown model id {shown(model_id)}; create it with create_model or load_weights")

    def sampling_session(self, tenant: str, sampling_id: str) -> SamplingSession:
        return owned(self.sampling.get(sampling_id), tenant,
                     f"unknown sampling session {shown(sampling_id)} (sampling sessions end with their session, "
                     "and a tenant's least recently used idle one is closed when it opens more than "
                     "--max-sampling-sessions)")

    def own_run(self, tenant: str, run_id: str) -> dict[str, Any]:
        run = self._run_info(run_id)
        if run["owner"] != tenant:
            raise RequestError(404, f"unknown training run {shown(run_id)}")
        return run

    def readable(self, tenant: str, path: TinkerPath) -> dict[str, Any]:
        """The run of a checkpoint ``tenant`` may load: its own, or one its owner published."""
        run = self._run_info(path.run_id)
        if run["owner"] != tenant and not self.checkpoints.is_public(path):
            raise RequestError(404, f"unknown training run {shown(path.run_id)}")
        return run

    def _run_info(self, run_id: str) -> dict[str, Any]:
        try:
            return self.checkpoints.read_run(run_id)
        except CheckpointError as exc:
            raise RequestError(404, str(exc)) from None

    def new_future(self, tenant: str, kind: str, session_id: str | None, target: tuple[str, int] | None = None
                   ) -> Future:
        check_limit(tenant, self.futures.pending(tenant), self.limits.queued, "requests queued or running",
                    "--max-queued-requests", "wait for results before sending more", RETRY_SOON)
        return self.futures.create(kind, tenant, session_id, target)

    # --- sampling sessions: opened by sampling requests and by save_weights_for_sampler ------------

    def add_sampling(self, tenant: str, session_id: str, weights: SamplerWeights, model_path: str | None) -> str:
        """Open a sampling session in ``session_id`` (which must still be open: a session's sampling
        sessions end with it), making room for it under the tenant's limit first."""
        sampling_id = f"smp-{secrets.token_hex(16)}"
        with self._sampling_lock:
            session = self.sessions.get(session_id)
            if session is None or session.finished:
                raise RequestError(404, f"unknown or expired session {shown(session_id)} "
                                        "(sessions end when heartbeats stop)")
            self._make_room(tenant)
            self.sampling[sampling_id] = SamplingSession(sampling_id, tenant, session_id, weights, model_path,
                                                         next(self._ticks))
            session.samplers.add(sampling_id)
        return sampling_id

    def make_room(self, tenant: str) -> None:
        """The 429 :meth:`add_sampling` would give now, if any (closing idle sampling sessions to avoid it)."""
        with self._sampling_lock:
            self._make_room(tenant)

    def _make_room(self, tenant: str) -> None:
        """Close the tenant's least recently used idle sampling sessions until one more fits its limit
        (the client opens one per SamplingClient and never closes them: an RL loop opens one a step);
        429 when every one is busy (see ``SamplingSession.busy``). Called with the lock held."""
        mine = sorted((s for s in self.sampling.values() if s.tenant == tenant), key=lambda s: s.last_used)
        excess = len(mine) - self.limits.sampling_sessions + 1
        if excess <= 0:
            return
        idle = [s for s in mine if not s.busy(self.futures)]
        check_limit(tenant, len(mine) - len(idle), self.limits.sampling_sessions,
                    "sampling sessions with samples queued, running or not yet collected", "--max-sampling-sessions",
                    "the least recently used idle one is closed when another opens, so collect the results of "
                    "samples sent", RETRY_SOON)
        for sampling in idle[:excess]:
            self._close_sampling(sampling.sampling_session_id, self.sessions.get(sampling.session_id))

    def _close_sampling(self, sampling_id: str, session: Session | None) -> None:
        """Forget a sampling session and its completion logs (its weights go with their last user)."""
        self.sampling.pop(sampling_id, None)
        if session is not None:
            session.samplers.discard(sampling_id)
        self.futures.forget_sampling_session(sampling_id)

    def used(self, sampling: SamplingSession, sample: Future) -> None:
        with self._sampling_lock:
            sampling.busy(self.futures)  # drops the samples collected
            sampling.last_used = next(self._ticks)
            sampling.samples.append(sample)

    # --- letting go --------------------------------------------------------------------------------

    def drop_session(self, session: Session) -> None:
        """Free what a finished or reaped session held (checkpoints on disk stay)."""
        for model_id in list(session.models):
            if self.models.pop(model_id, None) is not None:
                self.worker.submit(Job(None, model_id, run=partial(_drop, model_id), tenant=session.tenant))
        with self._sampling_lock:
            for sampling_id in list(session.samplers):
                self._close_sampling(sampling_id, session)
        for future in self.futures.forget_session(session.session_id):
            if future.kind == "sample":  # nobody will fetch it: stop decoding it
                self.stop_sample(future, "its session was reaped")

    def stop_sample(self, future: Future, reason: str) -> None:
        """Fail an unfinished sample (the sampler skips a job whose future is settled) and stop its decoding."""
        if not future.done:
            self.futures.fail(future, reason, "user")
            self.sampler.cancel(future.request_id)


def check_limit(tenant: str, used: int, limit: int, what: str, option: str, hint: str,
                headers: Mapping[str, str]) -> None:
    if used >= limit:
        raise RequestError(429, f"tenant {tenant!r} already has {used} {what}, the most one tenant may have "
                                f"({option} {limit}); {hint}", headers)


def parse_path(path: str) -> TinkerPath:
    try:
        return TinkerPath.parse(path)
    except CheckpointError as exc:
        raise RequestError(400, str(exc)) from None


Owned = TypeVar("Owned")


def owned(item: Owned | None, tenant: str, message: str) -> Owned:
    """``item`` when ``tenant`` owns it; else the 404 an id never issued gets, so no tenant learns another's ids."""
    if item is None or getattr(item, "tenant", None) != tenant:
        raise RequestError(404, message)
    return item


def _drop(model_id: str, backend: Backend) -> dict[str, Any]:
    backend.drop(model_id)
    return {}
