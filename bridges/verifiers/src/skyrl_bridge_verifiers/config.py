"""Options of the ``verifiers`` env id."""

from __future__ import annotations

import importlib.util

from pydantic import Field, field_validator
from skyrl_core.catalog import CatalogEnvConfig

DEFAULT_NAME = "skyrl_bridge_verifiers.example:load_environment"


class VerifiersEnvConfig(CatalogEnvConfig):
    """``env.name``: a verifiers taskset id (an installed taskset package or a built-in one, as
    ``verifiers.v1.load_environment`` resolves it) or ``module:function`` returning a ``vf.Env`` or
    ``vf.Taskset``; ``env.args``: the taskset config's fields (id form) or the function's kwargs."""

    name: str = Field(DEFAULT_NAME, min_length=1,
                      description="verifiers taskset id, or module:function returning a vf.Env / vf.Taskset "
                                  "(default: the bridge's bundled arithmetic example).")
    max_turns: int = Field(10, ge=1, description="Policy replies per episode; the peer's loop is told the "
                                                 "exchange is over (stop 'max_turns') when it asks for more.")
    data_files: str | None = Field(None, description="A JSONL file of task rows (the fields of the taskset's "
                                                     "TaskData, e.g. prompt, answer) used instead of the "
                                                     "taskset's own load().")
    max_rows: int = Field(1000, ge=1, description="At most this many rows are read from the taskset (infinite "
                                                  "tasksets are cut here).")
    seat: str | None = Field(None, description="The env's agent seat the policy plays (default: its first).")
    gold_template: str | None = Field(None, description="Gold reply as a str.format template over the task "
                                                        "data fields, e.g. '<answer>{answer}</answer>' (default: "
                                                        "the peer task's gold_reply() if it has one).")
    peer_timeout_s: float = Field(120.0, gt=0, description="Longest wait for the peer's loop between turns.")

    @field_validator("name")
    @classmethod
    def _findable(cls, name: str) -> str:
        """A name that verifiers cannot find is an error where the config is read, not in every episode.

        Only where the module would come from is looked up (nothing is imported or built here)."""
        module = name.partition(":")[0] if ":" in name else None
        candidates = [module] if module else [f"verifiers.v1.tasksets.{name}", name]
        for candidate in candidates:
            try:
                if importlib.util.find_spec(candidate) is not None:
                    return name
            except (ImportError, ValueError):  # a parent package missing, or a malformed module name
                continue
        what = f"module {module!r} is not importable" if module else f"no verifiers taskset {name!r} is installed"
        raise ValueError(f"{what}: give a taskset id (`skyrl envs --catalog verifiers` lists them) or "
                         "module:function returning a verifiers Env or Taskset (set PYTHONPATH for a local module)")

