"""The contracts between the components a run wires together, beside :class:`~skyrl_core.engine.InferenceEngine`:
what ``skyrl run`` needs of a trainer, and what a trainer needs of a generator.

They are structural (:class:`typing.Protocol`): a plugin's class satisfies one by having its members, not by
subclassing it. :func:`skyrl_core.factory.trainer_class` and :func:`~skyrl_core.factory.generator_class` check
a registered class against them when it is loaded, so a wrong entry point fails there, naming the component.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from skyrl_core.trajectory import TrajectoryBatch


@runtime_checkable
class Generator(Protocol):
    """Plays episodes of one env against one engine (``register_generators``; core's ``default`` is
    :class:`~skyrl_core.generator.MultiTurnGenerator`).

    Built as ``cls(config, engine=..., tokenizer=..., env_id=..., env_config=...)``: ``config`` is the run's
    ``generator`` section, validated by the spec's config class (``None`` when it declares none). Trainers read
    ``n_samples_per_prompt`` and ``temperature`` from that section where it has them.
    """

    async def generate(self, tasks: Sequence[Mapping[str, Any]], n_samples: int | None = None, *,
                       seed: int | None = None) -> TrajectoryBatch:
        """``n_samples`` episodes per task (default: the config's), in input order. ``seed`` seeds the batch's
        sampling; a generator whose ``generate`` takes no ``seed`` is still run, unseeded (with a warning)."""
        ...

    def close(self) -> None:
        """Release what the generator holds (its env workers on Ray, where placed there)."""
        ...


@runtime_checkable
class Trainer(Protocol):
    """Trains a policy (``register_trainers``; ``skyrl-trainers`` provides ``fsdp_grpo``). ``skyrl run`` builds
    it as ``cls(resolved_config)`` and calls :meth:`fit`.

    Optionally the class has ``check_config(resolved_config)`` (a classmethod): it raises
    :class:`~skyrl_core.factory.ConfigError` for options that contradict each other. ``skyrl run`` calls it
    before building the trainer, and ``skyrl run --print-config`` too, so a config it prints is one that starts.
    """

    def fit(self) -> Mapping[str, float]:
        """Train, writing the run folder; the run's summary, printed by ``skyrl run``."""
        ...
