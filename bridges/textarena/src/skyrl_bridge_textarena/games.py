"""What the bridge knows about each TextArena game without importing its module.

TextArena's registry (``textarena.envs.registration.ENV_REGISTRY``) names an entry point and its
constructor kwargs per id; it says nothing about seats, data or network. Those are read here from each
game's source text (no game module is imported: several call ``nltk.download`` when imported), plus a
short table of facts the source does not state plainly (multi-player games that also take two seats,
reward ranges that are not TextArena's usual ones).
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import os
import re
import sys
from dataclasses import dataclass, field
from typing import Any

VARIANT_SUFFIXES = ("-raw", "-train")
"""TextArena registers every game three times: plain, ``-raw`` and ``-train``; they differ only in TextArena's
observation/action wrappers, which this bridge does not apply (it shows each turn's new messages itself), so the
catalogue lists the plain id and accepts the other two as aliases."""

# Games whose state class is a multi-player one but that take exactly two seats as a two-player game.
TWO_SEAT_MULTIPLAYER = frozenset({"Briscola", "Golf", "LiarsDice", "Poker", "Snake", "Surround", "TwoDollar"})

# Reward ranges that differ from the defaults (single-player: [0, 1], or [-1, 1] when a game can end with
# TextArena's default invalid-move penalty of -1; two-player: [-1, 1]).
RANGE_OVERRIDES: dict[str, tuple[float, float]] = {
    "Klondike": (0.0, 52.0),   # cards in the foundations
    "Set": (0.0, 20.0),        # sets found in at most 20 turns
    "UltimateTexasHoldem": (-1.0, 1.0),
}

# Known reward bugs of textarena 0.7.4, shown in the catalogue (tag "peer-bug") and the README.
PEER_BUGS: dict[str, str] = {
    "Bandit": "the final choice compares the button with a dict, so the best button pays 0 and a worse one pays "
              "its regret (>0): the reward is inverted",
}

# Games whose textarena 0.7.4 wheel lacks a data file they open at reset.
BROKEN_PACKAGING: dict[str, str] = {
    "UsedCarNegotiation": "its data file instructions/blue_book.txt is missing from the textarena 0.7.4 wheel",
}

NETWORK_MARKERS = ("OpenRouterAgent", "OpenRouterJury", "jury_class", "OpenAI(")


@dataclass(frozen=True)
class GameInfo:
    """One registered TextArena id, as the bridge sees it."""

    id: str
    game: str                   # the folder under textarena/envs (e.g. "TicTacToe")
    entry_point: str            # "module:Class"
    kwargs: dict[str, Any] = field(default_factory=dict)
    players: str = "single"     # "single" | "two" | "multi"
    nltk: tuple[str, ...] = ()  # nltk resources the game loads ("words", "averaged_perceptron_tagger_eng")
    network: str | None = None  # why it needs the network (an LLM game master or jury), else None
    missing_modules: tuple[str, ...] = ()  # Python packages the game imports that are not installed
    invalid_penalty: bool = False  # a single-player game that can end with TextArena's default -1
    syntax_error: str | None = None  # the game's source does not parse on this Python (e.g. 3.12-only f-strings)

    @property
    def supported(self) -> bool:
        return self.unsupported_reason is None

    @property
    def unsupported_reason(self) -> str | None:
        if self.players == "multi":
            return "needs more than two players (the bridge seats one policy and one scripted opponent)"
        if self.network:
            return self.network
        if self.missing_modules:
            return f"imports {', '.join(self.missing_modules)}, not installed"
        if self.game in BROKEN_PACKAGING:
            return BROKEN_PACKAGING[self.game]
        if self.syntax_error:
            return f"its source does not parse on Python {sys.version_info.major}.{sys.version_info.minor} ({self.syntax_error})"
        return None

    @property
    def num_players(self) -> int:
        return 1 if self.players == "single" else 2

    def reward_range(self) -> tuple[float, float]:
        if self.game in RANGE_OVERRIDES:
            return RANGE_OVERRIDES[self.game]
        if self.players == "single":
            return (-1.0, 1.0) if self.invalid_penalty else (0.0, 1.0)
        return (-1.0, 1.0)


def base_id(env_id: str) -> str:
    for suffix in VARIANT_SUFFIXES:
        if env_id.endswith(suffix):
            return env_id[: -len(suffix)]
    return env_id


@functools.cache
def _registry() -> dict[str, Any]:
    from .peer import import_textarena

    return dict(import_textarena().envs.registration.ENV_REGISTRY)


def registered_ids() -> list[str]:
    """Every id of TextArena's registry, variants included."""
    return sorted(_registry())


def catalogue_ids() -> list[str]:
    """The plain ids (no ``-raw``/``-train`` variants)."""
    ids = _registry()
    return sorted(i for i in ids if not (i.endswith(VARIANT_SUFFIXES) and base_id(i) in ids))


def game_info(env_id: str) -> GameInfo:
    """What the bridge knows about ``env_id`` (a registered TextArena id); ``KeyError`` if unknown."""
    spec = _registry()[env_id]
    entry = spec.entry_point if isinstance(spec.entry_point, str) else \
        f"{spec.entry_point.__module__}:{spec.entry_point.__name__}"
    return _info(env_id, entry, tuple(sorted((k, _freeze(v)) for k, v in spec.kwargs.items())))


def _freeze(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


@functools.cache
def _info(env_id: str, entry: str, frozen_kwargs: tuple[tuple[str, Any], ...]) -> GameInfo:
    kwargs = {k: list(v) if isinstance(v, tuple) else v for k, v in frozen_kwargs}
    module = entry.split(":")[0]
    parts = module.split(".")
    game = parts[2] if len(parts) > 2 and parts[:2] == ["textarena", "envs"] else parts[-1]
    source = _source(module)
    states = set(re.findall(r"ta\.(\w*State)\(", source))
    if "SinglePlayerState" in states or re.search(r"min_players\s*=\s*1\s*,\s*max_players\s*=\s*1", source):
        players = "single"
    elif states == {"TwoPlayerState"} or game in TWO_SEAT_MULTIPLAYER:
        players = "two"
    else:
        players = "multi"
    network = None
    if any(marker in source for marker in NETWORK_MARKERS) or any("jury" in k for k in kwargs):
        network = "needs the network: an LLM game master or jury through the OpenRouter API"
    try:
        ast.parse(source)
        syntax_error = None
    except SyntaxError as exc:
        syntax_error = f"{exc.msg}, line {exc.lineno}"
    return GameInfo(id=env_id, game=game, entry_point=entry, kwargs=kwargs, players=players, syntax_error=syntax_error,
                    nltk=_nltk_resources(source), network=network, missing_modules=_missing_modules(source),
                    invalid_penalty=players == "single" and _default_penalty(source))


def _source(module: str) -> str:
    """The text of ``module``'s file, found without importing it (nor its package's ``__init__``)."""
    spec = importlib.util.find_spec("textarena")
    root = os.path.dirname(spec.origin) if spec and spec.origin else ""
    path = os.path.join(os.path.dirname(root), *module.split(".")) + ".py"
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except OSError:
        return ""


_DOWNLOAD = re.compile(r"nltk\.download\(\s*(\[[^\]]*\]|['\"][^'\"]+['\"])")


def _nltk_resources(source: str) -> tuple[str, ...]:
    found: set[str] = set()
    for match in _DOWNLOAD.finditer(source):
        found.update(re.findall(r"['\"]([^'\"]+)['\"]", match.group(1)))
    if "word_lists" in source:  # textarena.envs.utils.word_lists.EnglishDictionary loads nltk's words
        found.add("words")
    if re.search(r"from nltk\.corpus import words|corpus\.words", source):
        found.add("words")
    if re.search(r"\bpos_tag\b", source):
        found.add("averaged_perceptron_tagger_eng")
    return tuple(sorted(found))


def _missing_modules(source: str) -> tuple[str, ...]:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return ()
    names: set[str] = set()
    for node in tree.body:  # module-level imports: those run when the game is made
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    missing = []
    for name in sorted(names - set(sys.stdlib_module_names) - {"textarena"}):
        if importlib.util.find_spec(name) is None:
            missing.append(name)
    return tuple(missing)


def _default_penalty(source: str) -> bool:
    """True when some ``set_invalid_move(...)`` call passes no ``reward=`` (TextArena's default is -1)."""
    for match in re.finditer(r"set_invalid_move\(", source):
        depth, end = 1, match.end()
        while end < len(source) and depth:
            depth += {"(": 1, ")": -1}.get(source[end], 0)
            end += 1
        if "reward" not in source[match.end():end]:
            return True
    return False
