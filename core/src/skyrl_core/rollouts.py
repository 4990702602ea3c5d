"""Episodes without training, as ``skyrl rollout`` and ``skyrl eval`` both play them.

The two commands resolve the same things from their flags (the config, the task rows, the engine and
the generator) and play one batch with a progress bar; they differ only in what they do with it.

A hosted model needs no tokenizer: the ``openai`` engine with neither ``engine.mode`` nor
``engine.tokenizer`` set plays in chat mode (:func:`episode_config`, said in one line). An engine with a
``preflight()`` coroutine (the ``openai`` engine: ``GET /models``) is checked before any episode, so an
unreachable server or a refused key stops the command before any table or output file.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from skyrl_core.config import ResolvedConfig, build_config
from skyrl_core.data import load_tasks
from skyrl_core.env import TextEnv
from skyrl_core.factory import ConfigError, env_class
from skyrl_core.hookspecs import hookimpl
from skyrl_core.plugins import get_plugin_manager
from skyrl_core.ray_cluster import connect_for_run
from skyrl_core.trajectory import TrajectoryBatch


@dataclass
class Rollout:
    """Everything one batch of episodes needs, resolved and loaded."""

    cfg: ResolvedConfig
    env_cls: type[TextEnv]
    rows: list[dict[str, Any]]
    engine: Any
    generator: Any
    samples: int
    note: str | None = None
    """A line for the user about a choice made for them (the openai engine's chat mode), if any."""

    @property
    def episodes(self) -> int:
        return len(self.rows) * self.samples


def prepare_rollout(layers: Sequence[Mapping[str, Any]], *, split: str, tasks: Path | None, n_tasks: int,
                    samples: int | None) -> Rollout:
    """Validate ``layers`` (later wins), read the task rows, make the engine and the generator.

    ``samples=None`` takes the config's ``generator.n_samples_per_prompt`` when a layer sets it, else 1
    (the generator's own default is a GRPO group size, not a number of episodes to look at). Raises
    :class:`~skyrl_core.factory.ConfigError`, ``RegistryError``, ``DataError`` or ``EngineError`` with a
    message for the user.
    """
    pm = get_plugin_manager()
    cfg, note = episode_config(layers)
    connect_for_run(cfg)  # Ray before the engine: one instance for env workers and engines (shut down at exit)
    cls = env_class(cfg.env_id, pm.registry)
    rows = load_tasks(cls, cfg.env, split=split, path=str(tasks) if tasks else None, limit=n_tasks or None)
    engine = pm.registry.make("engine", cfg.engine_id, cfg.engine)
    tokenizer = getattr(engine, "tokenizer", None)
    if tokenizer is None:
        chat = " (the served model's), or engine.mode=chat for chat completions without one" \
            if _is_openai(cfg.engine) else ""
        raise ConfigError(f"engine {cfg.engine_id!r} has no tokenizer; set engine.tokenizer=NAME_OR_PATH{chat}")
    preflight = getattr(engine, "preflight", None)
    if callable(preflight):  # before any episode: an unreachable server stops here, naming its URL
        asyncio.run(preflight())
    if samples is None:  # a flag's default never overrides the config file or an override
        configured = "n_samples_per_prompt" in cfg.generator.model_fields_set
        samples = cfg.generator.n_samples_per_prompt if configured else 1
    generator = pm.registry.make("generator", cfg.generator_id, cfg.generator, engine=engine, tokenizer=tokenizer,
                                 env_id=cfg.env_id, env_config=cfg.env)
    return Rollout(cfg, cls, rows, engine, generator, samples, note)


CHAT_MODE_NOTE = ("engine: openai in chat mode (messages to /chat/completions, no tokenizer needed; trajectories "
                  "are for evaluation, not training). Set engine.tokenizer=NAME for token-exact /completions.")


def episode_config(layers: Sequence[Mapping[str, Any]]) -> tuple[ResolvedConfig, str | None]:
    """The config of episodes without training (``layers`` merged, later wins) and a note when a choice was
    made for the user.

    The ``openai`` engine with neither ``engine.mode`` nor ``engine.tokenizer`` set is put in chat mode: its
    default completions mode needs the served model's tokenizer, which a hosted model's name does not
    give. The note says so.
    """
    registry = get_plugin_manager().registry
    cfg = build_config(*layers, registry=registry, need_trainer=False)
    engine = cfg.engine
    if not _is_openai(engine) or engine.tokenizer or "mode" in engine.model_fields_set:  # type: ignore[union-attr]
        return cfg, None
    chat = build_config(*layers, {"engine": {"mode": "chat"}}, registry=registry, need_trainer=False)
    return chat, CHAT_MODE_NOTE


def _is_openai(engine_config: Any) -> bool:
    from skyrl_core.engines.openai import OpenAIEngineConfig

    return isinstance(engine_config, OpenAIEngineConfig)


def play_rollout(rollout: Rollout, *, stderr: bool = False) -> TrajectoryBatch:
    """Every row's episodes in one generator call, with a progress bar (on stderr when asked)."""
    pm = get_plugin_manager()
    with RolloutProgress(rollout.episodes, stderr=stderr) as progress:
        pm.register(progress)
        try:
            return asyncio.run(rollout.generator.generate(rollout.rows, n_samples=rollout.samples))
        finally:
            pm.unregister(progress)
            close = getattr(rollout.generator, "close", None)  # env workers on Ray, where placed there
            if callable(close):
                close()


class RolloutProgress:
    """A rich progress bar advanced by the ``on_rollout_end`` hook (or by :meth:`advance`)."""

    def __init__(self, total: int, description: str = "episodes", *, stderr: bool = False) -> None:
        from rich.console import Console
        from rich.progress import Progress

        self.progress = Progress(transient=False, console=Console(stderr=True) if stderr else None)
        self.task = self.progress.add_task(description, total=total)

    def __enter__(self) -> RolloutProgress:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def advance(self) -> None:
        self.progress.advance(self.task)

    @hookimpl
    def on_rollout_end(self, trajectory: Any) -> None:
        if trajectory.parent_id is None:
            self.advance()
