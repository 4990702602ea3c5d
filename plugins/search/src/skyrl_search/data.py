"""Questions for the ``search`` env: a built-in synthetic world, and loaders for Search-R1 files.

The built-in world is generated from a fixed seed with no network: a few thousand passages about
invented towns, rivers, people, companies, ships and fairs whose names are made of syllables, so no
model can know the answers without searching. Questions are single-hop ("In which town was X
born?", one passage answers it) or two-hop ("Who founded the company headquartered in the town
where X was born?", two searches). Every question carries ``gold_queries`` (one search per hop that
puts the needed passage in BM25's top 3) and ``gold_passage_ids``. The test split's questions share
no entity with the train split's, so memorising training answers does not help on test.

Question files: Search-R1's Parquet layout (``prompt`` messages ending in the question,
``reward_spec.ground_truth.target``, ``data_source``) or JSONL rows with ``question`` and
``answers`` (or ``golden_answers``).
"""

from __future__ import annotations

import json
import os
import random
import re
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from skyrl_core.data import DataError, read_jsonl_tasks

BUILTIN_VERSION = "builtin-v1"
SEED = 20250518
SPLIT_SIZES = {"train": 2000, "test": 300}
ONE_HOP = "skyrl_synthetic_1hop"
TWO_HOP = "skyrl_synthetic_2hop"

_ONSETS = ["b", "br", "d", "dr", "f", "g", "gr", "h", "k", "kr", "l", "m", "n", "p", "r", "s", "st", "t", "th",
           "tr", "v", "z", "sk", "w"]
_VOWELS = ["a", "e", "i", "o", "u", "ae", "ei", "ou", "y"]
_CODAS = ["", "", "n", "r", "l", "s", "th", "m", "nd", "rk", "sk", "v"]
_COMPANY_KINDS = ["Guild", "Works", "Foundry", "Mills", "Trading House", "Company", "Brewery", "Press"]
_TRADES = ["shipbuilding", "glassmaking", "clockmaking", "weaving", "printing", "brewing", "rope making",
           "salt trading", "ironworking", "paper milling", "instrument making", "dye making"]
_PROFESSIONS = ["cartographer", "engineer", "merchant", "botanist", "painter", "physician", "architect",
                "astronomer", "composer", "surveyor", "chemist", "poet", "lawyer", "weaver", "sculptor"]
_SHIP_KINDS = ["steamship", "schooner", "paddle steamer", "barque", "ferry", "cargo ship"]
_FAIR_KINDS = ["Lantern Fair", "Harvest Market", "Wool Fair", "River Festival", "Bell Festival", "Spring Market"]


@dataclass(frozen=True)
class Entity:
    id: str
    kind: str  # town, river, person, company, ship, fair
    name: str
    facts: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class World:
    """The generated world: its passages (id -> title, text) and its question candidates."""

    passages: list[dict[str, str]]
    questions: dict[str, list[dict[str, Any]]]


def _word(rng: random.Random, syllables: int) -> str:
    parts = [rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(syllables)]
    return ("".join(parts) + rng.choice(_CODAS)).capitalize()


class _Names:
    """Invented words, each used once in the whole world (so one name never means two things)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.used: set[str] = set()

    def fresh(self, syllables: int = 2) -> str:
        while True:
            word = _word(self.rng, syllables)
            if word not in self.used and len(word) >= 4:
                self.used.add(word)
                return word


def generate_world() -> World:
    """Generate the built-in world from its fixed seed (the same passages and questions every time)."""
    rng = random.Random(SEED)
    names = _Names(rng)
    given_names = [names.fresh(2) for _ in range(90)]  # shared by many people: similar-looking names
    lakes = [names.fresh(2) for _ in range(25)]
    rivers = [Entity(f"river-{i}", "river", names.fresh(1 + i % 2),
                     {"lake": rng.choice(lakes), "length": rng.randrange(40, 900), "hills": names.fresh(3)})
              for i in range(90)]
    towns = [Entity(f"town-{i}", "town", names.fresh(2 + i % 2),
                    {"river": rng.choice(rivers), "chartered": rng.randrange(1150, 1700),
                     "population": rng.randrange(800, 90000), "region": names.fresh(2)})
             for i in range(320)]
    people = []
    for i in range(1200):
        people.append(Entity(f"person-{i}", "person", f"{rng.choice(given_names)} {names.fresh(2 + i % 2)}",
                             {"born": rng.randrange(1700, 1950), "town": rng.choice(towns),
                              "profession": rng.choice(_PROFESSIONS), "moved": rng.choice(towns),
                              "pronoun": rng.choice(["He", "She"])}))
    companies = []
    for i in range(500):
        founder = people[rng.randrange(len(people))]
        year = founder.facts["born"] + rng.randrange(22, 60)
        companies.append(Entity(f"company-{i}", "company", f"{names.fresh(2 + i % 2)} {rng.choice(_COMPANY_KINDS)}",
                                {"founder": founder, "founded": year, "town": rng.choice(towns),
                                 "trade": rng.choice(_TRADES)}))
    ships = [Entity(f"ship-{i}", "ship", person.name,
                    {"launched": rng.randrange(1780, 1960), "town": rng.choice(towns), "kind": rng.choice(_SHIP_KINDS)})
             for i, person in enumerate(rng.sample(people, 500))]
    fairs = [Entity(f"fair-{i}", "fair", f"{town.name} {rng.choice(_FAIR_KINDS)}",
                    {"town": town, "first": rng.randrange(1300, 1900), "month": rng.choice(
                        ["March", "April", "May", "June", "July", "August", "September", "October"])})
             for i, town in enumerate(towns)]

    passages = [_passage(e) for e in [*towns, *rivers, *people, *companies, *ships, *fairs]]
    candidates = _questions(rng, towns, rivers, people, companies)
    return World(passages, _split(rng, candidates))


def _a(noun: str) -> str:
    return f"{'an' if noun[0] in 'aeiou' else 'a'} {noun}"


def _passage(e: Entity) -> dict[str, str]:
    f = e.facts
    if e.kind == "town":
        text = (f"{e.name} is a market town in the {f['region']} district, on the banks of the {f['river'].name} "
                f"river. It received its town charter in {f['chartered']} and has about {f['population']:,} "
                f"inhabitants.")
    elif e.kind == "river":
        text = (f"The {e.name} is a river that rises in the {f['hills']} hills and flows {f['length']} kilometres "
                f"before it empties into Lake {f['lake']}.")
    elif e.kind == "person":
        text = (f"{e.name} (born {f['born']} in {f['town'].name}) was {_a(f['profession'])}. {f['pronoun']} spent "
                f"most of {'his' if f['pronoun'] == 'He' else 'her'} working life in {f['moved'].name}.")
    elif e.kind == "company":
        text = (f"The {e.name} is {_a(f['trade'])} business headquartered in {f['town'].name}. It was founded in "
                f"{f['founded']} by {f['founder'].name}.")
    elif e.kind == "ship":
        text = (f"The {e.name} was {_a(f['kind'])} named after a local patron. She was launched at "
                f"{f['town'].name} in {f['launched']} and sailed for many years.")
    else:
        text = (f"The {e.name} is held every {f['month']} in {f['town'].name}. It was first held in {f['first']} "
                f"and draws visitors from the whole district.")
    return {"id": e.id, "title": e.name, "text": text}


def _questions(rng: random.Random, towns: list[Entity], rivers: list[Entity], people: list[Entity],
               companies: list[Entity]) -> list[dict[str, Any]]:
    """Every question the world supports, each with the entities its reasoning chain touches."""
    by_town: dict[str, list[Entity]] = {}
    for c in companies:
        by_town.setdefault(c.facts["town"].id, []).append(c)
    founded: dict[str, list[Entity]] = {}
    for c in companies:
        founded.setdefault(c.facts["founder"].id, []).append(c)

    def born_query(p: Entity) -> str:
        return f"{p.name} born"

    def company_query(c: Entity) -> str:
        return f"{c.name} founded"

    out: list[dict[str, Any]] = []

    def add(source: str, question: str, answer: str, hops: list[tuple[str, Entity]], extra: Iterable[Entity] = ()):
        out.append({"data_source": source, "question": question, "answers": [answer],
                    "gold_queries": [q for q, _ in hops], "gold_passage_ids": [e.id for _, e in hops],
                    "entities": sorted({e.id for _, e in hops} | {e.id for e in extra})})

    for p in people:
        town = p.facts["town"]
        add(ONE_HOP, f"In which town was {p.name} born?", town.name, [(born_query(p), p)], [town])
        add(ONE_HOP, f"In which year was {p.name} born?", str(p.facts["born"]), [(born_query(p), p)])
        add(TWO_HOP, f"On which river does the town where {p.name} was born lie?", town.facts["river"].name,
            [(born_query(p), p), (f"{town.name} town river", town)], [town.facts["river"]])
        local = by_town.get(town.id, [])
        if len(local) == 1 and local[0].facts["founder"].id != p.id:
            c = local[0]
            add(TWO_HOP, f"Who founded the company headquartered in the town where {p.name} was born?",
                c.facts["founder"].name, [(born_query(p), p), (f"headquartered in {town.name}", c)],
                [town, c.facts["founder"]])
    for c in companies:
        founder, town = c.facts["founder"], c.facts["town"]
        add(ONE_HOP, f"Who founded the {c.name}?", founder.name, [(company_query(c), c)], [founder])
        add(ONE_HOP, f"In which year was the {c.name} founded?", str(c.facts["founded"]), [(company_query(c), c)])
        add(ONE_HOP, f"In which town is the {c.name} headquartered?", town.name, [(company_query(c), c)], [town])
        add(TWO_HOP, f"In which town was the founder of the {c.name} born?", founder.facts["town"].name,
            [(company_query(c), c), (born_query(founder), founder)], [founder.facts["town"]])
        add(TWO_HOP, f"In which year was the founder of the {c.name} born?", str(founder.facts["born"]),
            [(company_query(c), c), (born_query(founder), founder)])
    for t in towns:
        river = t.facts["river"]
        add(ONE_HOP, f"On which river does the town of {t.name} lie?", river.name, [(f"{t.name} town river", t)],
            [river])
        add(ONE_HOP, f"In which year did {t.name} receive its town charter?", str(t.facts["chartered"]),
            [(f"{t.name} town charter", t)])
        add(TWO_HOP, f"Into which lake does the river that flows through {t.name} empty?",
            f"Lake {river.facts['lake']}", [(f"{t.name} town river", t), (f"{river.name} river lake", river)])
    for r in rivers:
        add(ONE_HOP, f"In which hills does the {r.name} river rise?", f"{r.facts['hills']} hills",
            [(f"{r.name} river rises hills", r)])
    rng.shuffle(out)
    return out


def _split(rng: random.Random, candidates: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Test first, then train from questions that touch none of the test questions' entities."""
    test: list[dict[str, Any]] = []
    test_entities: set[str] = set()
    per_source = SPLIT_SIZES["test"] // 2
    for source in (ONE_HOP, TWO_HOP):
        picked = [q for q in candidates if q["data_source"] == source][:per_source]
        test.extend(picked)
        for q in picked:
            test_entities.update(q["entities"])
    chosen = {id(q) for q in test}
    train = [q for q in candidates if id(q) not in chosen and test_entities.isdisjoint(q["entities"])]
    if len(train) < SPLIT_SIZES["train"]:
        raise RuntimeError(f"the built-in world has only {len(train)} train questions")
    train = train[:SPLIT_SIZES["train"]]
    rng.shuffle(test)

    def rows(split: str, qs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{"id": f"{split}-{i:04d}", **{k: v for k, v in q.items() if k != "entities"}}
                for i, q in enumerate(qs)]

    return {"train": rows("train", train), "test": rows("test", test)}


@lru_cache(maxsize=1)
def _world() -> World:
    return generate_world()


def builtin_passages() -> list[dict[str, str]]:
    """The built-in corpus: ``{"id", "title", "text"}`` per passage, in a fixed order."""
    return [dict(p) for p in _world().passages]


def builtin_questions(split: str = "train") -> list[dict[str, Any]]:
    """The built-in questions of ``split`` (``train``: 2,000, ``test``: 300); fresh copies."""
    questions = _world().questions
    if split not in questions:
        raise ValueError(f"the built-in search data has no split {split!r}; it has: {', '.join(questions)}")
    return json.loads(json.dumps(questions[split]))


def cache_root(cache_dir: str | Path | None = None) -> Path:
    """``cache_dir``, else ``$SKYRL_SEARCH_CACHE``, else ``~/.cache/skyrl/search``."""
    if cache_dir is not None:
        return Path(cache_dir)
    env = os.environ.get("SKYRL_SEARCH_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "skyrl" / "search"


def builtin_corpus_path(cache_dir: str | Path | None = None) -> Path:
    """The built-in corpus as wiki-18 JSONL (``{"id", "contents": "\\"Title\\"\\ntext"}`` per line),
    written once under :func:`cache_root` (``builtin-v1/corpus.jsonl``) with an atomic rename."""
    path = cache_root(cache_dir) / BUILTIN_VERSION / "corpus.jsonl"
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".corpus-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            for p in _world().passages:
                out.write(json.dumps({"id": p["id"], "contents": f'"{p["title"]}"\n{p["text"]}'}) + "\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


# -- question files -------------------------------------------------------------------------------

_QUESTION_MARK = re.compile(r"question\s*:\s*", re.IGNORECASE)


def load_questions(path: str | Path) -> list[dict[str, Any]]:
    """Question rows from a Search-R1 Parquet file or a JSONL file, each normalised to
    ``{"id", "question", "answers", "data_source"}`` (plus ``gold_queries`` when the row has them).
    A malformed row raises :class:`DataError` (a ValueError) naming the file and the row number."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"question file {str(path)!r} does not exist")
    if path.suffix.lower() == ".parquet":
        records = _read_parquet(path)
    elif path.suffix.lower() == ".jsonl":
        records = read_jsonl_tasks(path)
    else:
        raise DataError(f"question file {path.name}: expected a .parquet or .jsonl file")
    return [_normalize(record, path, number) for number, record in enumerate(records, start=1)]


def _read_parquet(path: Path) -> list[dict[str, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError(f"reading {path.name} needs pyarrow: pip install 'skyrl-search[parquet]'") from None
    try:
        return pq.read_table(path).to_pylist()
    except Exception as exc:  # noqa: BLE001 - any pyarrow failure is a bad file
        raise DataError(f"{path.name} is not a readable Parquet file: {exc}") from None


def _normalize(record: Any, path: Path, number: int) -> dict[str, Any]:
    where = f"{path.name} row {number}"
    if not isinstance(record, Mapping):
        raise DataError(f"{where}: expected an object, got {type(record).__name__}")
    question = _question(record)
    if not question:
        raise DataError(f"{where}: no question (expected 'question', extra_info.question, or a user message in "
                        "'prompt' ending in 'Question: ...')")
    answers = _answers(record)
    if answers is None:
        raise DataError(f"{where}: no answers (expected reward_spec.ground_truth.target, 'answers' or "
                        "'golden_answers' as a string or a list of strings)")
    row: dict[str, Any] = {"id": str(record.get("id") or f"{path.stem}-{number}"), "question": question,
                           "answers": answers, "data_source": str(record.get("data_source") or path.stem)}
    gold = record.get("gold_queries")
    if gold is not None:
        if not isinstance(gold, list) or not all(isinstance(q, str) and q.strip() for q in gold):
            raise DataError(f"{where}: 'gold_queries' must be a list of non-empty strings")
        row["gold_queries"] = list(gold)
    return row


def _dig(record: Mapping[str, Any], *keys: str) -> Any:
    for key in keys:
        if not isinstance(record, Mapping):
            return None
        record = record.get(key)
    return record


def _question(record: Mapping[str, Any]) -> str:
    for found in (record.get("question"), _dig(record, "extra_info", "question")):
        if isinstance(found, str) and found.strip():
            return found.strip()
    prompt = record.get("prompt")
    if isinstance(prompt, str):
        prompt = [{"role": "user", "content": prompt}]
    if not isinstance(prompt, list):
        return ""
    users = [m.get("content") for m in prompt if isinstance(m, Mapping) and m.get("role") == "user"]
    text = users[-1] if users and isinstance(users[-1], str) else ""
    parts = _QUESTION_MARK.split(text)
    return parts[-1].strip() if len(parts) > 1 else text.strip()


def _answers(record: Mapping[str, Any]) -> list[str] | None:
    for value in (_dig(record, "reward_spec", "ground_truth", "target"),
                  _dig(record, "reward_model", "ground_truth", "target"),
                  record.get("answers"), record.get("golden_answers"), record.get("answer")):
        if isinstance(value, str) and value.strip():
            return [value.strip()]
        if isinstance(value, (list, tuple)) and value and all(isinstance(v, (str, int, float)) for v in value):
            answers = [str(v).strip() for v in value if str(v).strip()]
            if answers:
                return answers
    return None
