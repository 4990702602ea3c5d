"""The training worker: one thread that owns the :class:`~skyrl_tinker.backend.Backend`.

Requests wait in a queue per tenant and model, each model's in arrival order (the client sends a
training client's requests one at a time, in ``seq_id`` order). The worker runs rounds, and a new
request joins the next round. A round takes a bounded share of every tenant's work (fair share): its
models in turn, each its leading ``forward_backward`` requests of one loss (at most
``--max-batch-datums`` datums, what the backend takes for one model) and then its next other request
(``optim_step``, a save...), until ``round_tokens`` tokens are taken (another request counts one; the
first always goes); tenants take turns being first. The share is one backend micro-batch by default:
the backend runs micro-batches one after another anyway, so a bigger share would batch no better,
and one tenant's flood delays another's small request by about one share, not the whole flood.
The ``forward_backward`` requests of a round
that use the same loss run as one batch: one model's consecutive requests are concatenated, and rows
of different models (and tenants) go through their own adapters in the same forward/backward (see
``Backend.forward_backward_many``; losses are sums, so no gradient mixes); then each model's other
request runs. A shared batch that fails is run again one model at a time (a failed call leaves the
backend as it was), so one model's rows can fail only that model's requests.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from skyrl_tinker.backend import Backend
from skyrl_tinker.futures import Future, FutureStore, Result
from skyrl_tinker.wire import ForwardBackwardIn, encode_forward_backward_output

log = logging.getLogger(__name__)


@dataclass
class Job:
    future: Future | None
    model_id: str | None
    run: Callable[[Backend], Result] | None = None
    fb: ForwardBackwardIn | None = None
    tenant: str | None = None  # whose share it comes out of: the future's tenant unless given

    def __post_init__(self) -> None:
        if self.tenant is None and self.future is not None:
            self.tenant = self.future.tenant

    def merge_key(self) -> tuple | None:
        if self.fb is None:
            return None
        return (self.fb.loss_fn, tuple(sorted(self.fb.loss_fn_config.items())), self.fb.forward_only)

    def size(self) -> int:
        """What the job takes of its tenant's share of a round: its tokens, or 1."""
        return 1 if self.fb is None else sum(len(datum.tokens) for datum in self.fb.data)

    def datums(self) -> int:
        return 0 if self.fb is None else len(self.fb.data)


@dataclass
class Turn:
    """One model's part of a round: leading ``forward_backward`` requests of one loss, then maybe its
    next other request."""

    model_id: str | None
    group: list[Job] = field(default_factory=list)
    then: Job | None = None

    def size(self) -> int:
        return sum(job.size() for job in self.group) + (self.then is not None)


Waiting = dict[str | None, deque[Job]]  # model id -> its requests in order


class TrainWorker:
    def __init__(self, backend: Backend, futures: FutureStore, round_tokens: int | None = None) -> None:
        self.backend = backend
        self.futures = futures
        self.round_tokens = round_tokens or backend.micro_batch_tokens  # one tenant's share of a round
        self._queue: queue.Queue[Job | None] = queue.Queue()
        self._waiting: dict[str | None, Waiting] = {}  # tenant -> its models' queues (worker thread only)
        self._thread = threading.Thread(target=self._loop, name="tinker-train", daemon=True)
        self.batch_sizes: list[int] = []  # requests merged per forward_backward call (for tests and the bench)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=30)

    def submit(self, job: Job) -> None:
        self._queue.put(job)

    def call(self, fn: Callable[[Backend], Result]) -> Result:
        """Run ``fn`` on the worker thread and wait for it (for short admin work such as reaping)."""
        done = threading.Event()
        box: list[Result | BaseException] = []

        def run(backend: Backend) -> Result:
            try:
                box.append(fn(backend))
            except BaseException as exc:  # handed back to the caller
                box.append(exc)
            done.set()
            return {}

        self._queue.put(Job(None, None, run=run))
        done.wait()
        if isinstance(box[0], BaseException):
            raise box[0]
        return box[0]

    def _loop(self) -> None:
        while True:
            stopping = self._collect(block=not self._waiting)
            while self._waiting:
                self._run_round(self._next_round())
                if not stopping:
                    break
            if stopping:
                return

    def _collect(self, block: bool) -> bool:
        """Move what was submitted into the tenants' queues (waiting for a job if ``block``); True once
        :meth:`stop` was called (jobs submitted after it are dropped)."""
        try:
            job = self._queue.get() if block else self._queue.get_nowait()
            while job is not None:
                self._waiting.setdefault(job.tenant, {}).setdefault(job.model_id, deque()).append(job)
                job = self._queue.get_nowait()
            return True
        except queue.Empty:
            return False

    def _next_round(self) -> list[Turn]:
        """Every waiting tenant's share, tenants in turn: this round's first goes last next round."""
        tenants = list(self._waiting)
        turns = [turn for tenant in tenants for turn in self._share(self._waiting[tenant])]
        for tenant in tenants:
            if not self._waiting[tenant]:
                del self._waiting[tenant]
        if tenants[0] in self._waiting:
            self._waiting[tenants[0]] = self._waiting.pop(tenants[0])
        return turns

    def _share(self, models: Waiting) -> list[Turn]:
        """One tenant's share of a round, its models in turn (a model served goes last next round)."""
        left = self.round_tokens
        turns: list[Turn] = []
        for model_id in list(models):
            if left <= 0:
                break
            jobs = models[model_id]
            turn = _turn(model_id, jobs, left, self.backend.max_batch_datums, first=not turns)
            if turn is None:  # its next request is larger than what is left of the share
                continue
            turns.append(turn)
            left -= turn.size()
            del models[model_id]
            if jobs:
                models[model_id] = jobs
        return turns

    def _run_round(self, turns: list[Turn]) -> None:
        """The round's forward_backward requests, one batch per loss, then each model's other request."""
        buckets: dict[tuple, list[tuple[str | None, list[Job]]]] = {}
        for turn in turns:
            if turn.group:
                buckets.setdefault(turn.group[0].merge_key(), []).append((turn.model_id, turn.group))
        for entries in buckets.values():
            self._run_forward_backward(entries)
        for turn in turns:
            if turn.then is not None:
                self._run_one(turn.then)

    def _run_one(self, job: Job) -> None:
        assert job.run is not None
        if job.future is None:  # internal work (reaping, ``call``): a failure is logged, the worker goes on
            try:
                job.run(self.backend)
            except Exception:
                log.exception("internal training-worker job failed")
        else:
            self.futures.run(job.future, lambda: job.run(self.backend))

    def _run_forward_backward(self, entries: list[tuple[str, list[Job]]]) -> None:
        """One backend call for every queued forward_backward of ``entries`` (one per model, same loss)."""
        jobs = [job for _, group in entries for job in group]
        self.batch_sizes.append(len(jobs))
        first = jobs[0].fb
        requests = [(model_id, [d for job in group for d in job.fb.data]) for model_id, group in entries]
        try:
            results = self.backend.forward_backward_many(requests, first.loss_fn, first.loss_fn_config,
                                                         forward_only=first.forward_only)
        except Exception as exc:  # requests are validated before queueing, so this is rare
            if len(entries) > 1:
                log.warning("a forward_backward batch of %d models failed (%s: %s); running each model alone",
                            len(entries), type(exc).__name__, exc)
                for entry in entries:
                    self._run_forward_backward([entry])
                return
            for job in jobs:
                self.futures.run(job.future, lambda exc=exc: _raise(exc))
            return
        for (_, group), result in zip(entries, results, strict=True):
            start = 0
            for job in group:
                outputs = result.outputs[start:start + len(job.fb.data)]
                start += len(job.fb.data)
                loss = float(sum(o["elementwise_loss"].sum() for o in outputs))
                self.futures.finish(job.future, encode_forward_backward_output(outputs, {"loss:sum": loss}))


def _turn(model_id: str | None, jobs: deque[Job], left: int, max_datums: int, first: bool) -> Turn | None:
    """Take ``model_id``'s leading forward_backward requests of one loss that fit ``left`` tokens and
    ``max_datums`` (one always if ``first``), then its next other request if the share is not spent;
    None when nothing fits."""
    turn = Turn(model_id)
    key = jobs[0].merge_key()
    datums = 0
    while jobs and key is not None and jobs[0].merge_key() == key and (
            first or (jobs[0].size() <= left and datums + jobs[0].datums() <= max_datums)):
        job = jobs.popleft()
        turn.group.append(job)
        left -= job.size()
        datums += job.datums()
        first = False
    if jobs and jobs[0].merge_key() is None and (first or left > 0):
        turn.then = jobs.popleft()
    return turn if turn.group or turn.then is not None else None


def _raise(exc: Exception) -> Result:
    raise exc
