"""Training tasks: the env's built-in dataset, or JSONL/Parquet files read with Hugging Face ``datasets``.

Every row is checked by building the env's prompt from it, so a bad row fails before training with
its file and row number. :class:`TaskStream` hands out batches in a seeded order per epoch and
records its position for exact resume.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from skyrl_core.data import DataError, read_jsonl_tasks
from skyrl_core.env import EnvConfig, TextEnv

_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}


def load_training_tasks(env_cls: type[TextEnv], env_config: EnvConfig, files: Sequence[str],
                        split: str = "train") -> list[dict[str, Any]]:
    """Rows of ``files`` (in order), or the env's built-in ``split``; each validated against the env."""
    if files:
        sources = [(str(path), row) for path in files for row in _read_file(str(path))]
    else:
        try:
            rows = list(env_cls.load_dataset(split, env_config))
        except NotImplementedError:
            raise DataError(f"{env_cls.__name__} has no built-in dataset; give task files in "
                            "trainer.train_files=[path.jsonl]") from None
        sources = [(f"{env_cls.__name__}.load_dataset({split!r})", row) for row in rows]
    if not sources:
        raise DataError(f"no training tasks in {list(files) or split!r}")
    tasks, numbers = [], {}
    for source, row in sources:
        numbers[source] = numbers.get(source, 0) + 1
        tasks.append(_checked(env_cls, env_config, row, f"{source}: row {numbers[source]}"))
    return tasks


def _read_file(path: str) -> list[Any]:
    suffix = Path(path).suffix.lower()
    if suffix not in _FORMATS:
        raise DataError(f"{path}: unsupported task file type {suffix!r}; use .jsonl, .json or .parquet")
    if not Path(path).is_file():
        raise DataError(f"task file {path!r} does not exist")
    import datasets

    try:
        dataset = datasets.load_dataset(_FORMATS[suffix], data_files=path, split="train")
    except Exception as exc:  # noqa: BLE001 - explain with the first bad line where we can find it
        if suffix == ".jsonl":
            read_jsonl_tasks(path)  # raises a DataError naming the bad row
        raise DataError(f"{path}: could not be read: {type(exc).__name__}: {exc}") from None
    return list(dataset)


def _checked(env_cls: type[TextEnv], env_config: EnvConfig, row: Any, where: str) -> dict[str, Any]:
    if not isinstance(row, Mapping):
        raise DataError(f"{where}: a task must be a mapping of fields, got {type(row).__name__}")
    task = dict(row)
    try:
        env_cls(task=task, config=env_config).build_prompt()
    except Exception as exc:  # noqa: BLE001 - any failure means the row is unusable
        raise DataError(f"{where}: not a valid {env_cls.__name__} task: {type(exc).__name__}: {exc}") from None
    return task


class TaskStream:
    """Endless batches over ``tasks``: a fresh seeded permutation each epoch, resumable by position."""

    def __init__(self, tasks: Sequence[dict[str, Any]], *, seed: int = 0, shuffle: bool = True) -> None:
        self.tasks = list(tasks)
        self.seed, self.shuffle = seed, shuffle
        self.epoch, self.offset = 0, 0
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> list[int]:
        order = list(range(len(self.tasks)))
        if self.shuffle:
            random.Random(f"{self.seed}-{epoch}").shuffle(order)
        return order

    def next_batch(self, size: int) -> list[dict[str, Any]]:
        batch = []
        while len(batch) < size:
            if self.offset == len(self._order):
                self.epoch, self.offset = self.epoch + 1, 0
                self._order = self._permutation(self.epoch)
            batch.append(self.tasks[self._order[self.offset]])
            self.offset += 1
        return batch

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "offset": self.offset, "num_tasks": len(self.tasks)}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        if state.get("num_tasks") != len(self.tasks):
            raise DataError(f"the checkpoint was taken with {state.get('num_tasks')} tasks but the dataset now has "
                            f"{len(self.tasks)}; resume with the same data")
        self.epoch, self.offset = int(state["epoch"]), int(state["offset"])
        self._order = self._permutation(self.epoch)

    # --- async training: tasks by their place in the stream ---------------------------------------

    @property
    def position(self) -> int:
        """Tasks handed out so far over all epochs: the index :meth:`task_at` gives the next one."""
        return self.epoch * len(self.tasks) + self.offset

    def task_at(self, index: int) -> dict[str, Any]:
        """The ``index``-th task of the stream (epoch ``index // len(tasks)``'s seeded order), the one the
        ``index``-th :meth:`next_batch` draw returns; it does not move the stream."""
        epoch, offset = divmod(index, len(self.tasks))
        order = self._order if epoch == self.epoch else self._permutation(epoch)
        return self.tasks[order[offset]]


class ConsumedTasks:
    """Which stream indexes (:meth:`TaskStream.task_at`) async training is done with, trained or dropped.

    Generation hands out indexes in order; groups finish and are trained out of order. The state is
    compact: every index below ``below`` is done, plus the sorted ``done`` ones above it. On resume,
    indexes under the ``frontier`` (the next never-drawn index) that are not done were generated but
    not trained when the run stopped: :meth:`next_index` hands them out again before new ones.
    """

    def __init__(self) -> None:
        self.below, self.frontier = 0, 0
        self.done: set[int] = set()
        self.trained: set[int] = set()  # trained (not dropped) since this object was created or loaded
        self._redo: list[int] = []

    def next_index(self) -> int:
        if self._redo:
            return self._redo.pop(0)
        self.frontier += 1
        return self.frontier - 1

    def finish(self, index: int, *, trained: bool) -> None:
        if self.is_done(index):
            raise ValueError(f"task index {index} was already trained or dropped")
        self.done.add(index)
        if trained:
            self.trained.add(index)
        while self.below in self.done:
            self.done.discard(self.below)
            self.below += 1

    def is_done(self, index: int) -> bool:
        return index < self.below or index in self.done

    def state_dict(self) -> dict[str, Any]:
        return {"below": self.below, "done": sorted(self.done), "frontier": self.frontier}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.below, self.frontier = int(state["below"]), int(state["frontier"])
        self.done = {int(i) for i in state["done"]}
        self.trained = set()
        self._redo = [i for i in range(self.below, self.frontier) if i not in self.done]
