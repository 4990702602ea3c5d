"""The training worker: one thread that owns the :class:`~skyrl_tinker.backend.Backend`.

Requests are queued in arrival order (the client sends a training client's requests one at a time,
in ``seq_id`` order). Each round the worker takes everything queued, keeps every model's requests in
their order, and merges consecutive ``forward_backward`` requests of one model with the same loss
into a single forward/backward over their concatenated data (same gradients: losses are sums), then
splits the outputs back per request. Models never share a batch: each has its own adapter.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass

from skyrl_tinker.backend import Backend
from skyrl_tinker.futures import Future, FutureStore, Result
from skyrl_tinker.wire import ForwardBackwardIn, encode_forward_backward_output


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
        by_model: dict[str | None, list[Job]] = {}
        for job in jobs:
            by_model.setdefault(job.model_id, []).append(job)
        for model_jobs in by_model.values():
            i = 0
            while i < len(model_jobs):
                group = [model_jobs[i]]
                key = group[0].merge_key()
                while key is not None and i + len(group) < len(model_jobs) \
                        and model_jobs[i + len(group)].merge_key() == key:
                    group.append(model_jobs[i + len(group)])
                i += len(group)
                if key is None:
                    self._run_one(group[0])
                else:
                    self._run_forward_backward(group)

    def _run_one(self, job: Job) -> None:
        assert job.run is not None
        if job.future is None:
            job.run(self.backend)
        else:
            self.futures.run(job.future, lambda: job.run(self.backend))

    def _run_forward_backward(self, group: list[Job]) -> None:
        self.batch_sizes.append(len(group))
        first = group[0].fb
        assert first is not None
        data = [d for job in group for d in job.fb.data]
        try:
            result = self.backend.forward_backward(group[0].model_id, data, first.loss_fn, first.loss_fn_config,
                                                   forward_only=first.forward_only)
        except Exception as exc:  # requests are validated before queueing, so this is rare; fail them all
            for job in group:
                self.futures.run(job.future, lambda exc=exc: _raise(exc))
            return
        start = 0
        for job in group:
            n = len(job.fb.data)
            outputs = result.outputs[start:start + n]
            start += n
            loss = float(sum(o["elementwise_loss"].sum() for o in outputs))
            self.futures.finish(job.future, encode_forward_backward_output(outputs, {"loss:sum": loss}))


def _raise(exc: Exception) -> Result:
    raise exc
