"""A sandbox backend from another package is a backend everywhere: one distribution with one entry point in
``skyrl_sandbox.backends`` makes it listed by ``skyrl-sandbox doctor`` and ``skyrl plugins``, offered as a Ray
resource, a valid ``backend`` of every env's config, and a place where workers start; a broken one is left out
with a warning naming its distribution, and the rest still load.

The distributions are built and installed with pip into a folder of their own (never into the venv), and
everything that reads them runs in a subprocess with that folder on ``PYTHONPATH``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

import pytest
from skyrl_sandbox.choice import strong_names
from skyrl_sandbox.registry import GROUP, backend_names
from skyrl_sandbox.testing import require_backend

# A real backend: bubblewrap's, under another name, with a Ray resource of its own; ``auto`` tries it last.
THROWAWAY = '''
from skyrl_sandbox.backends.bwrap import BwrapBackend


class ThrowawayBackend(BwrapBackend):
    name = "throwaway"
    auto_rank = 99
    ray_resource = "throwaway_slots"


BACKEND = ThrowawayBackend()
'''


def write_distribution(root: Path, name: str, modules: dict[str, str], entry_points: dict[str, str]) -> Path:
    """A source tree of distribution ``name`` 0.1.0: top-level ``modules`` and ``entry_points`` in GROUP."""
    root.mkdir()
    points = "\n".join(f'{point} = "{value}"' for point, value in entry_points.items())
    (root / "pyproject.toml").write_text(textwrap.dedent(f"""\
        [build-system]
        requires = ["setuptools>=77"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "{name}"
        version = "0.1.0"

        [tool.setuptools]
        py-modules = {json.dumps(sorted(modules))}

        [project.entry-points."{GROUP}"]
        """) + points + "\n")
    for module, source in modules.items():
        (root / f"{module}.py").write_text(source)
    return root


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """skyrl-throwaway (a working backend) and skyrl-broken-backends (one entry point whose module raises on
    import, one that is not a backend), installed by pip into a folder of their own."""
    tmp = tmp_path_factory.mktemp("backend-plugins")
    throwaway = write_distribution(tmp / "throwaway", "skyrl-throwaway", {"skyrl_throwaway": THROWAWAY},
                                   {"throwaway": "skyrl_throwaway:BACKEND"})
    broken = write_distribution(
        tmp / "broken", "skyrl-broken-backends",
        {"skyrl_broken_import": "raise RuntimeError('this backend cannot even be imported')\n",
         "skyrl_not_a_backend": "BACKEND = object()\n"},
        {"exploding": "skyrl_broken_import:BACKEND", "hollow": "skyrl_not_a_backend:BACKEND"})
    target = tmp / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--no-index", "--target", str(target), str(throwaway), str(broken)],
                   check=True, capture_output=True, timeout=300)
    with pytest.raises(PackageNotFoundError):
        distribution("skyrl-throwaway")  # the venv is untouched
    return target


def with_throwaway() -> list[str]:
    """The installed backends as the registry orders them once throwaway joins: last of the strong ones."""
    names = list(backend_names())
    return [*names[:len(strong_names())], "throwaway", *names[len(strong_names()):]]


def run_with(site: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    """``python *args`` with the installed distributions on the path."""
    path = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **env, "PYTHONPATH": path})


def test_doctor_lists_the_backend_and_its_ray_resource(site):
    done = run_with(site, "-m", "skyrl_sandbox.cli", "doctor")
    rows = {line.split()[0]: line.split()[1] for line in done.stdout.splitlines()[:-2] if line.strip()}
    assert list(rows)[:-2] == with_throwaway(), done.stdout  # every backend, strong ones first in auto's order
    assert rows["throwaway"] == rows["bwrap"]  # the same sandbox under another name: it works where bwrap does
    assert "exploding" not in rows and "hollow" not in rows
    resources = json.loads(run_with(site, "-m", "skyrl_sandbox.cli", "doctor", "--ray-resources").stdout)
    assert ("throwaway_slots" in resources) == (rows["bwrap"] == "ok") == ("bwrap" in resources)


def test_a_broken_backend_is_left_out_with_a_warning_naming_its_distribution(site):
    done = run_with(site, "-c", "from skyrl_sandbox import backend_names; print(*backend_names())")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == with_throwaway()
    assert ("sandbox backend entry point 'exploding' of skyrl-broken-backends failed to load: RuntimeError: this "
            "backend cannot even be imported") in done.stderr
    assert "sandbox backend entry point 'hollow' of skyrl-broken-backends is not a SandboxBackend" in done.stderr


def test_skyrl_plugins_lists_it_under_the_sandbox_extensions(site):
    done = run_with(site, "-c", "import sys; from skyrl_core.cli import main; sys.exit(main())", "plugins")
    assert done.returncode == 0, done.stderr
    (sandbox,) = [plugin for plugin in json.loads(done.stdout) if plugin["name"] == "skyrl-sandbox"]
    assert "entry_point_groups" in sandbox["hooks"]
    listed = {row["name"]: row for row in sandbox["extensions"][GROUP]}
    assert listed["throwaway"] == {"name": "throwaway", "value": "skyrl_throwaway:BACKEND",
                                   "provider": "skyrl-throwaway", "version": "0.1.0"}
    assert listed["bwrap"]["provider"] == "skyrl-sandbox"
    assert listed["exploding"]["provider"] == "skyrl-broken-backends"  # listed (names only): nothing is loaded


# Each env's config and the field that names its backend: a misspelling, and one without machines (harbor's needs them).
ENV_CONFIGS = """
import json
from pydantic import ValidationError
from skyrl_harbor_terminal.config import HarborTerminalConfig
from skyrl_rlm_repl.sandbox.config import SandboxConfig
from skyrl_sql.config import SQLEnvConfig

answers = {}
for model, field in ((SQLEnvConfig, "sandbox"), (SandboxConfig, "backend"), (HarborTerminalConfig, "backend")):
    for value in ("throwaway", "thorwaway", "subprocess"):
        try:
            answers[f"{model.__name__}.{field}={value}"] = getattr(model.model_validate({field: value}), field)
        except ValidationError as exc:
            answers[f"{model.__name__}.{field}={value}"] = exc.errors()[0]["msg"]
print(json.dumps(answers))
"""


def test_it_is_a_backend_option_of_every_env(site):
    done = run_with(site, "-c", ENV_CONFIGS)
    assert done.returncode == 0, done.stderr
    answers = json.loads(done.stdout)
    for config in ("SQLEnvConfig.sandbox", "SandboxConfig.backend", "HarborTerminalConfig.backend"):
        assert answers[f"{config}=throwaway"] == "throwaway"
        refused = answers[f"{config}=thorwaway"]
        assert "'thorwaway'" in refused and "throwaway" in refused.split("'thorwaway'")[1], refused
    assert answers["SQLEnvConfig.sandbox=subprocess"] == answers["SandboxConfig.backend=subprocess"] == "subprocess"
    assert "'subprocess' has no machines" in answers["HarborTerminalConfig.backend=subprocess"]


# A box's command and the rlm_repl env's REPL worker, both on the throwaway backend.
WORKERS = """
import asyncio
from skyrl_rlm_repl.sandbox.config import SandboxConfig
from skyrl_rlm_repl.sandbox.sandbox import Sandbox
from skyrl_sandbox.box import run

async def main():
    print((await run(["echo", "hi"], backend="throwaway")).stdout.decode().strip())
    async with await Sandbox.create(SandboxConfig(backend="throwaway", pool_size=1)) as repl:
        result = await repl.execute("print(6 * 7)")
        print(repl.backend, result.stdout.strip(), result.error)

asyncio.run(main())
"""


def test_workers_start_on_it(site):
    require_backend("bwrap")  # throwaway is bubblewrap under another name
    done = run_with(site, "-c", WORKERS)
    assert done.returncode == 0 and done.stdout.split() == ["hi", "throwaway", "42", "None"], done.stderr
