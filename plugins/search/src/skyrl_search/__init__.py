"""skyrl-search: Search-R1-style retrieval QA — <search> queries against a local index or a retrieval server."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from skyrl_core import EnvSpec, hookimpl

if TYPE_CHECKING:
    from skyrl_core.probe import Probe


@hookimpl
def register_envs(register):
    register(EnvSpec(
        id="search",
        entry_point="skyrl_search.env:SearchEnv",
        config="skyrl_search.config:SearchEnvConfig",
        description="Search-R1: reason, <search> a retriever, answer in <answer>; exact-match reward.",
        max_turns=4,
        stop=("</search>", "</answer>"),
        eval_splits={"train": "test"},  # env.data_files: the file of split 'test' (or set trainer.eval_split)
    ))


@hookimpl
def register_probes(register: Callable[[Probe], None]) -> None:
    from .probes import PROBES  # imported when the checker runs, not for every `skyrl` command

    for probe in PROBES:
        register(probe)


@hookimpl
def entry_point_groups() -> list[str]:
    from .retrieval import ENTRY_POINT_GROUP  # retrievers of other packages: listed by `skyrl plugins`

    return [ENTRY_POINT_GROUP]
