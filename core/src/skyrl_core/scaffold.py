"""``skyrl new env|generator NAME``: scaffold a plugin distribution that works as generated.

``skyrl new env countdown`` writes ``./skyrl-countdown/``: the distribution ``skyrl-countdown``
with the package ``skyrl_countdown`` (a :class:`~skyrl_core.env.TextEnv` subclass with a config
class, a small built-in dataset and gold actions, and the ``register_envs`` hook), the
``[project.entry-points.skyrl]`` table, tests that use core's pytest fixtures and a README. As
generated it installs beside ``skyrl-core`` alone, passes ``skyrl check countdown`` and its own
tests. ``skyrl new generator NAME`` does the same for a :class:`~skyrl_core.generator.MultiTurnGenerator`
subclass registered through ``register_generators``.

Only the standard library and typer are imported here, so building the CLI stays fast.
"""

from __future__ import annotations

import keyword
import re
from collections.abc import Callable
from pathlib import Path

import typer

NAME_PATTERN = re.compile(r"^[a-z][a-z0-9]*(?:[_-][a-z0-9]+)*$")
MAX_NAME_LENGTH = 40
# Names whose generated classes or ids would shadow core's (``EnvConfig``, ``TextEnv``,
# ``MultiTurnGenerator``, generator ``default``).
RESERVED = {"env": {"env", "text"}, "generator": {"default", "multi_turn"}}


class ScaffoldError(ValueError):
    """A name or target folder that ``skyrl new`` refuses; the message says why."""


class Names:
    """The names derived from ``NAME``: component id, distribution, package and class prefix."""

    def __init__(self, name: str, kind: str = "env") -> None:
        if not NAME_PATTERN.match(name) or len(name) > MAX_NAME_LENGTH:
            raise ScaffoldError(
                f"invalid name {name!r}: use lower-case letters, digits and single '_' or '-' between "
                f"words, starting with a letter, at most {MAX_NAME_LENGTH} characters (e.g. 'countdown')")
        self.id = name.replace("-", "_")
        if self.id == "skyrl" or self.id.startswith("skyrl_") or keyword.iskeyword(self.id):
            raise ScaffoldError(f"invalid name {name!r}: give the component name without the 'skyrl' prefix "
                                f"(e.g. 'countdown' makes the distribution 'skyrl-countdown')")
        if self.id in RESERVED.get(kind, ()):
            raise ScaffoldError(f"invalid name {name!r}: its {kind} would shadow one of skyrl-core's; choose another")
        self.dist = "skyrl-" + self.id.replace("_", "-")
        self.package = "skyrl_" + self.id
        self.cls = "".join(part.capitalize() for part in self.id.split("_"))

    def fill(self, template: str) -> str:
        """``template`` with the ``__ID__``/``__DIST__``/``__PKG__``/``__CLASS__`` placeholders filled in."""
        return (template.replace("__ID__", self.id).replace("__DIST__", self.dist)
                .replace("__PKG__", self.package).replace("__CLASS__", self.cls))


def scaffold_env(name: str, directory: Path | None = None) -> Path:
    """Write an env plugin distribution for ``name`` into ``directory`` (default ``./skyrl-<name>``)."""
    names = Names(name, "env")
    return _write(names, directory, {
        "pyproject.toml": PYPROJECT.replace("__KIND_DESCRIPTION__", "environment"),
        "README.md": ENV_README,
        "src/__PKG__/__init__.py": ENV_INIT,
        "src/__PKG__/env.py": ENV_MODULE,
        "tests/test___ID__.py": ENV_TESTS,
    })


def scaffold_generator(name: str, directory: Path | None = None) -> Path:
    """Write a generator plugin distribution for ``name`` into ``directory`` (default ``./skyrl-<name>``)."""
    names = Names(name, "generator")
    return _write(names, directory, {
        "pyproject.toml": PYPROJECT.replace("__KIND_DESCRIPTION__", "generator"),
        "README.md": GENERATOR_README,
        "src/__PKG__/__init__.py": GENERATOR_INIT,
        "src/__PKG__/generator.py": GENERATOR_MODULE,
        "tests/test___ID__.py": GENERATOR_TESTS,
    })


def _write(names: Names, directory: Path | None, files: dict[str, str]) -> Path:
    target = Path(directory) if directory is not None else Path.cwd() / names.dist
    if target.exists():
        raise ScaffoldError(f"{target} already exists; choose another --dir or remove it first")
    for relative, template in files.items():
        path = target / names.fill(relative)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(names.fill(template), encoding="utf-8")
    return target


def new_app() -> typer.Typer:
    """The ``skyrl new`` command group."""
    app = typer.Typer(help="Scaffold a new plugin distribution (env or generator).", no_args_is_help=True)
    app.command("env")(_command(scaffold_env, "env"))
    app.command("generator")(_command(scaffold_generator, "generator"))
    return app


def _command(scaffold: Callable[[str, Path | None], Path], kind: str) -> Callable[..., None]:
    def command(
        name: str = typer.Argument(..., help=f"The {kind} id in lower snake case, e.g. countdown."),  # noqa: B008
        directory: Path | None = typer.Option(None, "--dir", help="Folder to create (must not exist); "  # noqa: B008
                                              "default ./skyrl-<name>."),
    ) -> None:
        try:
            names = Names(name, kind)
            target = scaffold(name, directory)
        except ScaffoldError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None
        listing = f"skyrl check {names.id}" if kind == "env" else "skyrl generators"
        typer.echo(f"created {names.dist} ({kind} {names.id!r}) in {target}\n"
                   f"next:\n  pip install -e {target}\n  {listing}\n  pytest {target / 'tests'}")

    command.__doc__ = (f"Scaffold a new {kind} plugin: the distribution skyrl-<name> with package, hook, entry "
                       f"point, config class, tests and README.")
    return command


PYPROJECT = '''\
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "__DIST__"
version = "0.1.0"
description = "SkyRL __KIND_DESCRIPTION__ plugin: __ID__"
readme = "README.md"
requires-python = ">=3.10"
dependencies = ["skyrl-core>=0.1"]

[project.optional-dependencies]
# pytest for the tests; skyrl-core[test] adds the real small tokenizers of the scripted-engine test.
test = ["pytest>=8", "skyrl-core[test]>=0.1"]

# This table is how skyrl-core finds the plugin's hooks.
[project.entry-points.skyrl]
__ID__ = "__PKG__"

[tool.setuptools.packages.find]
where = ["src"]

[tool.pytest.ini_options]
testpaths = ["tests"]
'''

ENV_INIT = '''\
"""__DIST__: the ``__ID__`` environment for SkyRL."""

from skyrl_core import EnvSpec, hookimpl
from skyrl_core.hookspecs import Register


@hookimpl
def register_envs(register: Register) -> None:
    """Register the ``__ID__`` env; its module is imported only when the env is used."""
    register(EnvSpec(
        id="__ID__",
        entry_point="__PKG__.env:__CLASS__Env",
        config="__PKG__.env:__CLASS__Config",
        description="Add up a few integers; answer inside <answer></answer>; one retry.",
        max_turns=2,
        reward_range=(0.0, 1.0),
        eval_splits={"train": "test"},  # the held-out split a run evaluates on (and `skyrl rollout` plays)
    ))
'''

ENV_MODULE = '''\
"""The ``__ID__`` env: add up a few integers.

Action format: ``<answer>N</answer>``. A right sum ends the episode with reward 1.0; anything else
gets feedback, reward 0.0 and another try until ``max_turns``. The generator sums the rewards of all
turns, so an episode's total is 0.0 or 1.0 and stays within ``reward_range``.

Make it your own task by editing ``load_dataset`` (the built-in rows), ``build_prompt`` (the
opening messages for ``self.task``), ``take_action`` (scoring) and ``gold_actions`` (a solution,
which ``skyrl check`` plays to prove every task solvable at full reward).
"""

from __future__ import annotations

import random
import re
from typing import Any

from pydantic import Field
from skyrl_core import EnvConfig, StepResult, TextEnv

ANSWER = re.compile(r"<answer>\\s*(-?\\d+)\\s*</answer>")
SYSTEM = "Add up the user's numbers. Reply with the sum inside <answer></answer> tags and nothing else."


class __CLASS__Config(EnvConfig):
    """The ``env.*`` keys of the ``__ID__`` env."""

    max_turns: int = 2
    dataset_size: int = Field(50, ge=1, description="Rows in each built-in split.")
    max_numbers: int = Field(4, ge=2, description="Most integers in one task.")


class __CLASS__Env(TextEnv):
    """Add up the integers of ``task["numbers"]``."""

    config_class = __CLASS__Config
    config: __CLASS__Config
    reward_range = (0.0, 1.0)

    def build_prompt(self) -> list[dict[str, str]]:
        numbers = self.task.get("numbers")
        if not isinstance(numbers, list) or not numbers or not all(isinstance(n, int) for n in numbers):
            raise ValueError("__ID__ task needs a non-empty 'numbers' list of integers")
        return [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": " + ".join(str(n) for n in numbers)}]

    def take_action(self, action: str) -> StepResult:
        match = ANSWER.search(action)
        if match is None:
            feedback = "Put the sum inside <answer></answer> tags."
            return StepResult([{"role": "user", "content": feedback}], 0.0, False, False, {"format_ok": False})
        if int(match.group(1)) == sum(self.task["numbers"]):
            return StepResult([], 1.0, True, False, {"format_ok": True, "correct": True})
        return StepResult([{"role": "user", "content": "That is not the sum. Try again."}], 0.0, False, False,
                          {"format_ok": True, "correct": False})

    def gold_actions(self) -> list[str]:
        return [f"<answer>{sum(self.task['numbers'])}</answer>"]

    @classmethod
    def load_dataset(cls, split: str = "train", config: EnvConfig | None = None) -> list[dict[str, Any]]:
        cfg = config if isinstance(config, __CLASS__Config) else __CLASS__Config()
        rng = random.Random(f"__ID__-{split}")
        sizes = [rng.randint(2, cfg.max_numbers) for _ in range(cfg.dataset_size)]
        return [{"id": f"{split}-{i}", "numbers": [rng.randint(-20, 99) for _ in range(size)]}
                for i, size in enumerate(sizes)]
'''

ENV_TESTS = '''\
"""Tests of the ``__ID__`` env, using the pytest fixtures that skyrl-core installs (``pytest --fixtures``)."""

from __future__ import annotations

import asyncio
import json

import pytest
from skyrl_core.testing import check_adversarial, check_env

from __PKG__.env import __CLASS__Config, __CLASS__Env

ROW = {"id": "t-0", "numbers": [2, 3, 4]}


def new_env() -> __CLASS__Env:
    env = __CLASS__Env(task=ROW, config=__CLASS__Config())
    env.reset(seed=0)
    return env


def test_passes_the_conformance_checker_on_every_built_in_row(skyrl_plugin_manager):
    report = check_env("__ID__", n_tasks=0)
    assert not report.failed


def test_no_scripted_hostile_policy_finds_a_reward_hack(skyrl_plugin_manager):
    check_adversarial("__ID__", n_tasks=0, raise_on_flag=True)


def test_is_listed_with_this_distribution_as_provider(skyrl_cli):
    result = skyrl_cli("envs", "--json")
    assert result.exit_code == 0, result.output
    rows = {row["id"]: row for row in json.loads(result.stdout)}
    assert rows["__ID__"]["provider"] == "__DIST__"


def test_right_sum_ends_the_episode_with_full_reward():
    _, reward, terminated, truncated, _ = new_env().step("<answer>9</answer>")
    assert (reward, terminated, truncated) == (1.0, True, False)


def test_wrong_then_right_episode_total_stays_within_reward_range():
    env = new_env()
    _, first, terminated, _, info = env.step("<answer>8</answer>")
    assert (first, terminated, info["correct"]) == (0.0, False, False)
    _, second, terminated, _, _ = env.step("<answer>9</answer>")
    low, high = __CLASS__Env.reward_range
    assert terminated and low <= first + second <= high


def test_malformed_action_gets_feedback_instead_of_an_exception():
    observation, reward, terminated, _, info = new_env().step("nine")
    assert (reward, terminated, info["format_ok"]) == (0.0, False, False)
    assert "<answer>" in observation[0]["content"]


def test_built_in_dataset_is_deterministic_per_split_and_sized_by_config():
    config = __CLASS__Config(dataset_size=5)
    train = __CLASS__Env.load_dataset("train", config)
    assert len(train) == 5 and train == __CLASS__Env.load_dataset("train", config)
    assert train != __CLASS__Env.load_dataset("test", config)


def test_scripted_episode_through_the_default_generator(skyrl_plugin_manager, scripted_engine):
    pytest.importorskip("transformers", reason="scripted_engine needs pip install 'skyrl-core[test]'")
    from skyrl_core import GeneratorConfig, MultiTurnGenerator

    engine = scripted_engine("<answer>8</answer>", "<answer>9</answer>")
    generator = MultiTurnGenerator(GeneratorConfig(), engine=engine, tokenizer=engine.tokenizer, env_id="__ID__")
    [trajectory] = asyncio.run(generator.generate([ROW], n_samples=1))
    assert trajectory.error is None
    assert [turn.reward for turn in trajectory.turns] == [0.0, 1.0]
    assert trajectory.reward == 1.0
'''

ENV_README = '''\
# __DIST__

A SkyRL environment plugin: `__ID__`. The model adds up a few integers and replies with
`<answer>N</answer>`; a right sum ends the episode with reward 1.0, anything else gets feedback and
one more try (reward 0.0), so an episode's total reward stays within `reward_range` (0.0, 1.0).

```bash
pip install -e .                 # beside skyrl-core; `skyrl envs` lists __ID__ from __DIST__
skyrl check __ID__               # the conformance checker, gold actions on the built-in rows
pip install -e '.[test]' && pytest
skyrl rollout --env __ID__ --oracle --n-tasks 0
skyrl run --env __ID__ --trainer fsdp_grpo trainer.model=tiny-random   # with skyrl-trainers installed
```

## Layout

- `src/__PKG__/env.py`: `__CLASS__Env(TextEnv)` (`build_prompt`, `take_action`, `gold_actions`,
  `load_dataset`) and its config class `__CLASS__Config(EnvConfig)`.
- `src/__PKG__/__init__.py`: the `@hookimpl def register_envs(register)` hook registering the `EnvSpec`.
- `pyproject.toml`: the `[project.entry-points.skyrl]` table through which skyrl-core finds the hook.
- `tests/`: tests using skyrl-core's pytest fixtures (`skyrl_plugin_manager`, `skyrl_cli`,
  `scripted_engine`); the scripted-engine test needs `skyrl-core[test]` and is skipped without it.

## Config fields (`env.*`)

| field | default | meaning |
|---|---|---|
| `max_turns` | `2` | tries per task |
| `max_action_chars` | `50000` | longer actions are rejected unread |
| `dataset_size` | `50` | rows per built-in split (deterministic per split name) |
| `max_numbers` | `4` | most integers in one task |

Example: `skyrl check __ID__ env.dataset_size=10 env.max_numbers=6`.
'''

GENERATOR_INIT = '''\
"""__DIST__: the ``__ID__`` generator for SkyRL."""

from skyrl_core import GeneratorSpec, hookimpl
from skyrl_core.hookspecs import Register


@hookimpl
def register_generators(register: Register) -> None:
    """Register the ``__ID__`` generator; its module is imported only when the generator is used."""
    register(GeneratorSpec(
        id="__ID__",
        entry_point="__PKG__.generator:__CLASS__Generator",
        config="__PKG__.generator:__CLASS__GeneratorConfig",
        description="Core's multi-turn generator that leaves failed episodes out of the training batch.",
    ))
'''

GENERATOR_MODULE = '''\
"""The ``__ID__`` generator: core's multi-turn generator, minus the episodes that failed.

A trajectory whose ``error`` is set (an env or engine failure, a prompt too long) must not be trained
on; this generator leaves such episodes out of the batch it returns (they still count in the batch
metrics). Change rollouts by overriding ``run_episode`` (one episode), ``training_samples`` (what an
episode turns into) or ``generate`` (the whole batch).
"""

from __future__ import annotations

from pydantic import Field
from skyrl_core import GeneratorConfig, MultiTurnGenerator, Trajectory


class __CLASS__GeneratorConfig(GeneratorConfig):
    """The ``generator.*`` keys of the ``__ID__`` generator (core's ``default`` keys plus these)."""

    drop_failed: bool = Field(True, description="Leave episodes that ended with an error out of the batch.")


class __CLASS__Generator(MultiTurnGenerator):
    """:class:`MultiTurnGenerator` whose batches hold no failed episodes (with ``drop_failed``)."""

    config: __CLASS__GeneratorConfig

    def training_samples(self, episode: Trajectory) -> list[Trajectory]:
        if self.config.drop_failed and episode.error is not None:
            return []
        return super().training_samples(episode)
'''

GENERATOR_TESTS = '''\
"""Tests of the ``__ID__`` generator, using the pytest fixtures that skyrl-core installs (``pytest --fixtures``)."""

from __future__ import annotations

import asyncio
import json

import pytest
from pydantic import ValidationError
from skyrl_core import EnvSpec, StepResult, TextEnv, hookimpl
from skyrl_core.hookspecs import Register

from __PKG__.generator import __CLASS__Generator, __CLASS__GeneratorConfig

ENV_ID = "__ID___echo_test"


class EchoEnv(TextEnv):
    """One turn: reward 1.0 for replying "ok"."""

    def build_prompt(self) -> list[dict[str, str]]:
        return [{"role": "user", "content": "Say ok."}]

    def take_action(self, action: str) -> StepResult:
        return StepResult([], float(action.strip() == "ok"), True, False, {})


class EchoPlugin:
    """Registers :class:`EchoEnv` for these tests only (through the ``register_skyrl_plugin`` fixture)."""

    @hookimpl
    def register_envs(self, register: Register) -> None:
        register(EnvSpec(id=ENV_ID, entry_point=f"{__name__}:EchoEnv", max_turns=1))


def test_is_listed_with_this_distribution_as_provider(skyrl_cli):
    result = skyrl_cli("generators", "--json")
    assert result.exit_code == 0, result.output
    rows = {row["id"]: row for row in json.loads(result.stdout)}
    assert rows["__ID__"]["provider"] == "__DIST__"


def test_config_keeps_core_keys_and_validates_its_own():
    config = __CLASS__GeneratorConfig(n_samples_per_prompt=2)
    assert (config.n_samples_per_prompt, config.drop_failed) == (2, True)
    with pytest.raises(ValidationError):
        __CLASS__GeneratorConfig(drop_failed="sometimes")


@pytest.mark.parametrize(("drop_failed", "kept"), [(True, 1), (False, 2)])
def test_failed_episodes_are_left_out_of_the_batch(register_skyrl_plugin, scripted_engine, drop_failed, kept):
    pytest.importorskip("transformers", reason="scripted_engine needs pip install 'skyrl-core[test]'")
    register_skyrl_plugin(EchoPlugin())
    engine = scripted_engine("ok")  # one reply: the second episode's engine call fails
    generator = __CLASS__Generator(__CLASS__GeneratorConfig(drop_failed=drop_failed, max_concurrency=1),
                                   engine=engine, tokenizer=engine.tokenizer, env_id=ENV_ID)
    batch = asyncio.run(generator.generate([{"id": "a"}, {"id": "b"}], n_samples=1))
    assert len(batch) == kept
    assert [t.reward for t in batch if t.error is None] == [1.0]
'''

GENERATOR_README = '''\
# __DIST__

A SkyRL generator plugin: `__ID__`, core's multi-turn generator (`MultiTurnGenerator`) that leaves
failed episodes (those whose `error` is set) out of the batch it returns, so a trainer never trains
on them.

```bash
pip install -e .                 # beside skyrl-core; `skyrl generators` lists __ID__ from __DIST__
pip install -e '.[test]' && pytest
skyrl rollout --env reverse_text --generator __ID__ --engine openai engine.base_url=http://127.0.0.1:8000/v1
skyrl run --env reverse_text --trainer fsdp_grpo generator.id=__ID__ trainer.model=tiny-random
```

## Layout

- `src/__PKG__/generator.py`: `__CLASS__Generator(MultiTurnGenerator)` and its config class
  `__CLASS__GeneratorConfig(GeneratorConfig)`.
- `src/__PKG__/__init__.py`: the `@hookimpl def register_generators(register)` hook registering the
  `GeneratorSpec`.
- `pyproject.toml`: the `[project.entry-points.skyrl]` table through which skyrl-core finds the hook.
- `tests/`: tests using skyrl-core's pytest fixtures (`skyrl_cli`, `register_skyrl_plugin`,
  `scripted_engine`); the scripted-engine test needs `skyrl-core[test]` and is skipped without it.

## Config fields (`generator.*`)

All of core's `default` generator fields (`n_samples_per_prompt`, `max_tokens_per_turn`, ...) plus:

| field | default | meaning |
|---|---|---|
| `drop_failed` | `true` | leave episodes that ended with an error out of the batch |
'''
