"""Catalogues (issue 37): one env id hosting many named envs, listed by `skyrl envs --catalog ID` and scored
by `skyrl check ID --catalog`, each env in a child process of its own."""

from __future__ import annotations

import json
import os
import time
from typing import Any, ClassVar

import pytest
from skyrl_core import CatalogEntry, CatalogEnvConfig, EnvSpec, StepResult, TextEnv, hookimpl
from skyrl_core.catalog import catalog_entries, catalog_ids
from skyrl_core.registry import RegistryError
from skyrl_core.scorecard import score_catalog

SECRETS = {"fair": "blue", "lenient": "green", "hangs": "red", "crashes": "pink", "nodata": "grey"}


class ToyConfig(CatalogEnvConfig):
    name: str = "fair"
    max_turns: int = 2


class Toys(TextEnv):
    """A bridge-shaped env: ``env.name`` picks one of five toy games."""

    config_class = ToyConfig
    reward_range: ClassVar[tuple[float, float]] = (0.0, 1.0)

    def build_prompt(self) -> list[dict[str, str]]:
        name = self.config.name
        if name == "hangs":
            time.sleep(3600)
        if name == "crashes":
            os._exit(3)
        if name == "nodata":
            raise FileNotFoundError("toy corpus 'words' is not installed: set TOY_DATA to a folder holding it")
        return [{"role": "user", "content": "Name the colour in <answer></answer>."}]

    def take_action(self, action: str) -> StepResult:
        secret = SECRETS[self.config.name]
        said = action.split("<answer>")[-1].split("</answer>")[0].strip()
        right = said == secret or (self.config.name == "lenient" and said[:2] == secret[:2])
        return StepResult([] if right else [{"role": "user", "content": "No."}], float(right), right, False, {})

    def gold_actions(self) -> list[str]:
        return [f"<answer>{SECRETS[self.config.name]}</answer>"]

    @classmethod
    def load_dataset(cls, split: str = "train", config: Any = None) -> list[dict[str, Any]]:
        return [{"id": f"{config.name if config else 'fair'}-{i}"} for i in range(2)]


def entries() -> list[CatalogEntry | str]:
    return [CatalogEntry("fair", "names its colour", reward_range=(0.0, 1.0), max_turns=2, tags=("toy",)),
            CatalogEntry("lenient", "accepts the first two letters"), "hangs", "crashes", "nodata"]


@pytest.fixture
def toys(register_skyrl_plugin):
    class Plugin:
        @hookimpl
        def register_envs(self, register):
            register(EnvSpec(id="toys", entry_point=f"{__name__}:Toys", catalog=f"{__name__}:entries", max_turns=2,
                             description="five toy games"))
            register(EnvSpec(id="single", entry_point=f"{__name__}:Toys"))

    register_skyrl_plugin(Plugin())


def test_a_catalogue_lists_its_envs_sorted_and_one_env_is_not_one(toys, skyrl_cli):
    assert [entry.name for entry in catalog_entries("toys")] == ["crashes", "fair", "hangs", "lenient", "nodata"]
    assert "toys" in catalog_ids() and "single" not in catalog_ids()
    with pytest.raises(RegistryError, match=r"env 'single' has no catalogue.*catalogues: .*toys"):
        catalog_entries("single")
    listed = skyrl_cli("envs", "--catalog", "toys", "--json")
    assert listed.exit_code == 0, listed.output
    fair = next(record for record in json.loads(listed.stdout) if record["name"] == "fair")
    assert fair == {"name": "fair", "description": "names its colour", "multi_turn": False, "reward_range": [0.0, 1.0],
                    "max_turns": 2, "tags": ["toy"]}
    table = skyrl_cli("envs", "--catalog", "toys")
    assert table.exit_code == 0 and "toys: 5 envs" in table.output and "accepts the first two letters" in table.output
    missing = skyrl_cli("envs", "--catalog", "nope")
    assert missing.exit_code == 2 and "unknown env id 'nope'" in missing.output


def test_the_scorecard_gives_each_env_its_row_whatever_the_env_does(toys):
    rows = {row.name: row for row in score_catalog("toys", adversarial=True, timeout_s=8)}
    assert list(rows) == ["crashes", "fair", "hangs", "lenient", "nodata"]
    assert rows["fair"].ok and rows["fair"].gold == "reached" and rows["fair"].flagged == []
    assert rows["lenient"].conformance == "pass" and "near_miss" in rows["lenient"].flagged
    assert any("near_miss" in reason and "gold's full reward" in reason for reason in rows["lenient"].reasons)
    assert rows["hangs"].error == "timed out after 8 s" and not rows["hangs"].ok
    assert rows["crashes"].error == "the check process died (exit code 3)"
    nodata = rows["nodata"]
    assert nodata.conformance == "fail" and "toy corpus 'words' is not installed" in " ".join(nodata.failed)


def test_skyrl_check_catalog_prints_one_row_per_env_and_exits_1_on_a_flag(toys, skyrl_cli):
    result = skyrl_cli("check", "toys", "--catalog", "--names", "fair,lenient", "--adversarial", "--quick")
    assert result.exit_code == 1, result.output
    assert "toys: scorecard of 2 env(s)" in result.output and "lenient:" in result.output
    assert result.output.strip().splitlines()[-1] == ("2 of 2 pass conformance; 1 flagged by the probes; "
                                                      "2 reach their gold; 0 could not be checked")
    only_fair = skyrl_cli("check", "toys", "--catalog", "--names", "fair", "--json")
    assert only_fair.exit_code == 0, only_fair.output
    (row,) = json.loads(only_fair.stdout)
    assert row["name"] == "fair" and row["ok"] and row["conformance"] == "pass" and not row["probed"]
    typo = skyrl_cli("check", "toys", "--catalog", "--names", "fiar")
    assert typo.exit_code == 2 and "no catalogue env 'fiar'. Did you mean 'fair'?" in typo.output
