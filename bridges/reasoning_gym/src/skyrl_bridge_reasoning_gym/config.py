"""``env.*`` options of the ``reasoning_gym`` env: which dataset (``env.name``) and its own options (``env.args``)."""

from __future__ import annotations

from typing import Any

from pydantic import Field, ValidationInfo, field_validator
from skyrl_core.catalog import CatalogEnvConfig

from skyrl_bridge_reasoning_gym import peer

DEFAULT_DATASET = "basic_arithmetic"
DEFAULT_SCORER_TIMEOUT_S = 5.0


class ReasoningGymConfig(CatalogEnvConfig):
    """One reasoning-gym dataset as a one-turn env: the question, a reply with ``<answer>...</answer>``, the
    dataset's own ``score_answer``."""

    name: str = Field(DEFAULT_DATASET, min_length=1,
                      description="The reasoning-gym dataset (`skyrl envs --catalog reasoning_gym` lists them).")
    args: dict[str, Any] = Field(default_factory=dict, validate_default=True, description=(
        "The dataset's own options (its config dataclass's fields, e.g. env.args.min_value=1), checked by it. "
        "seed: the train rows' seed (default 0; the test rows use another); size: how many train rows "
        "(default 64). composite takes datasets=[{name, weight, config}]."))
    test_size: int = Field(peer.DEFAULT_TEST_SIZE, ge=1, le=peer.MAX_ROWS,
                           description="How many rows the built-in 'test' split has (none repeats a train question).")
    system_prompt: bool = Field(True, description="Open with a system message saying how to give the answer "
                                                  "(off: the instruction ends the user message instead).")
    scorer_timeout_s: float = Field(DEFAULT_SCORER_TIMEOUT_S, gt=0, le=600, description=(
        "Wall-clock seconds for one answer's score on the datasets whose scorer evaluates the answer as Python "
        "(binary_matrix, n_queens, spiral_matrix, string_insertion, countdown, puzzle24, "
        "polynomial_multiplication, simple_integration, intermediate_integration): it runs in a forked child "
        "with memory and CPU limits, stopped past this; a stopped scorer scores a missing answer."))

    @field_validator("name")
    @classmethod
    def _known(cls, value: str) -> str:
        return peer.check_name(value)

    @field_validator("args")
    @classmethod
    def _valid_args(cls, value: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        name = info.data.get("name")
        if name is None:  # the name failed: its own error says why
            return value
        peer.validate_args(name, value)
        return value
