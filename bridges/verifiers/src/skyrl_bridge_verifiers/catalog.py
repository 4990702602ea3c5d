"""``skyrl envs --catalog verifiers``: the verifiers tasksets installed here, found as verifiers finds them.

verifiers resolves a taskset id by module name: ``verifiers.v1.tasksets.<id>`` (built in), else a top-level
module ``<id>`` (an installed taskset package). Built-ins are listed from the package folder and installed
packages from their distribution metadata (a distribution that depends on verifiers): nothing is imported.
"""

from __future__ import annotations

import pkgutil
import re
from importlib import metadata
from importlib.util import find_spec

from skyrl_core.catalog import CatalogEntry

from .config import DEFAULT_NAME

BUILTIN_NOTES = {
    "textarena": ("TextArena games (env.args.game=Wordle-v0, ...); the game engine plays the user", True,
                  ("multi-turn", "needs nltk:words", "needs nltk:averaged_perceptron_tagger_eng")),
    "harbor": ("Harbor terminal tasks", True, ("needs containers", "needs task files")),
    "nemo_gym": ("NeMo Gym resource servers", True, ("needs a NeMo Gym server",)),
    "openenv": ("OpenEnv environments", True, ("needs an OpenEnv server",)),
}


def entries() -> list[CatalogEntry]:
    listed = [CatalogEntry(DEFAULT_NAME, "The bridge's bundled example: arithmetic in <answer> tags, correctness "
                                         "(weight 1) + format (weight 0.2)", reward_range=(0.0, 1.2),
                           max_turns=1, tags=("example", "single-turn"))]
    spec = find_spec("verifiers.v1.tasksets")
    for module in pkgutil.iter_modules(spec.submodule_search_locations if spec else []):
        about, multi, tags = BUILTIN_NOTES.get(module.name, ("built-in verifiers taskset", False, ()))
        listed.append(CatalogEntry(module.name, about, multi_turn=multi, tags=("builtin", *tags)))
    for dist in metadata.distributions():
        name = dist.metadata.get("Name") or ""
        if name.lower() in ("verifiers",) or name.lower().startswith("skyrl"):
            continue
        requires = [re.split(r"[\s;<>=!~\[]", r, maxsplit=1)[0].lower() for r in (dist.requires or [])
                    if "extra ==" not in r]  # an optional integration is not a taskset package
        if "verifiers" not in requires:
            continue
        for module in _top_level(dist):
            listed.append(CatalogEntry(module, f"installed verifiers taskset package ({name} {dist.version})",
                                       tags=("installed",)))
    return listed


def _top_level(dist: metadata.Distribution) -> list[str]:
    text = dist.read_text("top_level.txt")
    if text:
        return [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("_")]
    modules = {str(f).split("/")[0].removesuffix(".py") for f in (dist.files or []) if str(f).endswith(".py")}
    return sorted(m for m in modules if m.isidentifier() and not m.startswith("_"))
