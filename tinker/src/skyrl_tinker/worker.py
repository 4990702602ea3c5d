"""The training worker: one thread that owns the :class:`~skyrl_tinker.backend.Backend`.

Requests are queued in arrival order (the client sends a training client's requests one at a time,
in ``seq_id`` order). Each round the worker takes everything queued and keeps every model's requests
in their order. The leading ``forward_backward`` requests of all models that use the same loss run as
one batch: one model's consecutive requests are concatenated, and rows of different models go
through their own adapters in the same forward/backward (see ``Backend.forward_backward_many``;
losses are sums, so no gradient mixes). Then each model's next other request (``optim_step``, a
save...) runs, and so on until the queue is empty. A shared batch that fails is run again one model
at a time (a failed call leaves the backend as it was), so one model's rows can fail only that
model's requests.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

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

    def merge_key(self) -> tuple | None:
        if self.fb is None:
            return None
        return (self.fb.loss_fn, tuple(sorted(self.fb.loss_fn_config.items())), self.fb.forward_only)


class TrainWorker:
    def __init__(self, backend: Backend, futures: FutureStore) -> None:
        self.backend = backend
        self.futures = futures
        self._queue: queue.Queue[Job | None] = queue.Queue()
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
            first = self._queue.get()
            if first is None:
                return
            jobs = [first]
            while True:
                try:
                    job = self._queue.get_nowait()
                except queue.Empty:
                    break
                if job is None:
                    self._run_all(jobs)
                    return
                jobs.append(job)
            self._run_all(jobs)

    def _run_all(self, jobs: list[Job]) -> None:
        queues: dict[str | None, deque[Job]] = {}
        for job in jobs:
            queues.setdefault(job.model_id, deque()).append(job)
        while queues:
            # every model's leading forward_backward requests, bucketed by loss across models
            buckets: dict[tuple, list[tuple[str, list[Job]]]] = {}
            for model_id, queue_ in queues.items():
                key = queue_[0].merge_key()
                if key is None:
                    continue
                group = []
                while queue_ and queue_[0].merge_key() == key:
                    group.append(queue_.popleft())
                buckets.setdefault(key, []).append((model_id, group))
            for entries in buckets.values():
                self._run_forward_backward(entries)
            for queue_ in queues.values():  # then each model's next other request, in its order
                if queue_ and queue_[0].merge_key() is None:
                    self._run_one(queue_.popleft())
            queues = {m: q for m, q in queues.items() if q}

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


def _raise(exc: Exception) -> Result:
    raise exc
