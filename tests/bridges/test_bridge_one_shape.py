"""The five bridges share one shape (issue 37): the env id is the ecosystem's name, `env.name` picks the peer env
(an unknown one is a config error with the catalogue command), `env.args` carries the peer's options,
`skyrl envs --catalog ID` lists the peer's names, and listing envs imports no peer."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from skyrl_core.catalog import CatalogEnvConfig, catalog_entries
from skyrl_core.factory import ConfigError, component_config, env_class

BRIDGES = {"reasoning_gym": ("reasoning_gym", "gcd", "gdc"), "skyrl_gym": ("skyrl_gym", "gsm8k", "gsm8"),
           "verifiers": ("verifiers", None, "no_such_taskset"),
           "textarena": ("textarena", "TowerOfHanoi-v0", "TowerOfHanoy-v0"),
           "openenv": ("openenv", "demo", "dmeo")}


@pytest.mark.parametrize("env_id", sorted(BRIDGES))
def test_env_name_picks_a_listed_peer_env_and_an_unknown_one_is_a_config_error(env_id):
    _, listed, typo = BRIDGES[env_id]
    assert issubclass(env_class(env_id).config_class, CatalogEnvConfig)
    names = [entry.name for entry in catalog_entries(env_id)]
    assert names and (listed is None or listed in names)
    config = component_config("env", env_id, {})  # a default peer env: `skyrl check ID` needs no options
    assert config.name and config.args == {}
    with pytest.raises(ConfigError, match=r"env(\.name)?: .*" + typo):
        component_config("env", env_id, {"name": typo})


def test_listing_envs_imports_no_peer_library():
    peers = ["reasoning_gym", "skyrl_gym", "verifiers", "textarena", "openenv"]
    code = ("import json, sys; from skyrl_core.plugins import get_registry; "
            "ids = get_registry().ids('env'); "
            f"print(json.dumps([ids, [m for m in {peers!r} if m in sys.modules]]))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    ids, imported = json.loads(done.stdout)
    assert set(BRIDGES) <= set(ids) and imported == []
