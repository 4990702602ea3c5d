"""No package names a sandbox backend in its code: backends are plugins, read from skyrl-sandbox's registry.

A string literal whose whole value is a backend name (``"bwrap"``, ``'docker'``...) outside the backends' own
packages means some code decides by name what the backend's attributes (strong, has_machines, runs_images,
ray_resource...) should say, and a new backend would be left out there. Docstrings and prose that mention a
backend are fine: only literals equal to a name count.
"""

from __future__ import annotations

import io
import tokenize
from ast import literal_eval
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NAMES = {"bwrap", "docker", "subprocess", "podman"}
PACKAGES = ["core", "sandbox", "trainers", "tinker", "viewer", "sandbox-podman",
            *(f"{kind}/{path.name}" for kind in ("plugins", "bridges") for path in sorted((ROOT / kind).iterdir()))]
OWN = [ROOT / "sandbox" / "src" / "skyrl_sandbox" / "backends", ROOT / "sandbox-podman"]  # the backends themselves
# The one name kept on purpose: sql's deprecated value 'process' still means the built-in subprocess backend.
ALLOWED = {"plugins/sql/src/skyrl_sql/config.py": {"subprocess"}}


def backend_literals(path: Path) -> list[str]:
    """``path:line: literal`` for each string literal in ``path`` whose value is a backend name."""
    found = []
    for token in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
        if token.type != tokenize.STRING:
            continue
        try:
            value = literal_eval(token.string)
        except (ValueError, SyntaxError):
            continue
        if value in NAMES and value not in ALLOWED.get(str(path.relative_to(ROOT)), ()):
            found.append(f"{path.relative_to(ROOT)}:{token.start[0]}: {token.string}")
    return found


def test_no_package_names_a_sandbox_backend_outside_the_backends():
    sources = [path for package in PACKAGES if (ROOT / package / "src").is_dir()
               for path in sorted((ROOT / package / "src").rglob("*.py"))
               if not any(path.is_relative_to(own) for own in OWN)]
    assert len(sources) > 100
    found = [hit for path in sources for hit in backend_literals(path)]
    assert not found, "backend names in code (read the registry instead):\n" + "\n".join(found)
