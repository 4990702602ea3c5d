"""``skyrl check ENV --adversarial --quick`` passes on every shipped env and plays each probe its plugin registers.

harbor_terminal runs on both machine backends; CI sets SKYRL_REQUIRE_DOCKER=1 and SKYRL_REQUIRE_BWRAP=1,
so there a backend that cannot run fails instead of skipping.
"""

from __future__ import annotations

import re

import pytest
from skyrl_core.testing.adversarial import registered_probes
from skyrl_sandbox.testing import require_backend

CASES = [
    pytest.param("reverse_text", None, id="reverse_text"),
    pytest.param("sql", None, id="sql"),
    pytest.param("search", None, id="search"),
    pytest.param("rlm_repl", None, id="rlm_repl"),
    pytest.param("harbor_terminal", "bwrap", id="harbor_terminal-bwrap"),
    pytest.param("harbor_terminal", "docker", id="harbor_terminal-docker", marks=pytest.mark.slow),  # 30-45 s
]


@pytest.mark.slow  # up to ~30 s a case: every probe against a real env
@pytest.mark.parametrize(("env_id", "backend"), CASES)
def test_no_probe_finds_a_reward_hack_in_a_shipped_env(skyrl_cli, env_id: str, backend: str | None):
    overrides = []
    if backend is not None:
        require_backend(backend)
        overrides.append(f"env.backend={backend}")
    result = skyrl_cli("check", env_id, "--adversarial", "--quick", *overrides)
    assert result.exit_code == 0, result.output
    own = [probe.name for probe in registered_probes(env_id)]
    assert own, f"the {env_id} plugin registers no probes"
    for name in own:
        assert re.search(rf"^{name} +[1-9]\d* .* ok$", result.output, re.MULTILINE), f"{name} not played:\n" \
                                                                                     f"{result.output}"
