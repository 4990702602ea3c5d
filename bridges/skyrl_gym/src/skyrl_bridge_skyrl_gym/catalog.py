"""What the bridge knows about each env skyrl-gym 0.4.0 registers: turns, reward range, what a row and the env need.

Everything here was read from skyrl-gym 0.4.0's source (its envs' ``__init__``/``step`` and reward functions);
:func:`entries` lists the peer's live registry, so an env a later skyrl-gym adds shows up as unsupported.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from skyrl_core.catalog import CatalogEntry

MULTI_TURN_FORMAT_SCORE = 0.2
"""gsm8k_multi_turn pays ``0.2 / max_turns`` for each well-formatted wrong answer ('#### N'), on every turn."""


@dataclass(frozen=True)
class PeerEnv:
    """One skyrl-gym env as the bridge runs it."""

    name: str
    description: str
    max_turns: int  # the peer's own default when extras carry no max_turns
    multi_turn: bool
    reward_range: tuple[float, float]  # per episode; gsm8k_multi_turn's depends on max_turns (see episode_range)
    row_needs: tuple[str, ...]  # dotted row fields the peer asserts on
    config_fields: tuple[str, ...] = ()  # fields of the peer's env_config dataclass (env.args)
    tags: tuple[str, ...] = ()
    io: bool = False  # calls a database, a server or a subprocess (no RNG guard around it; see env.py)
    supported: bool = True
    why_unsupported: str = ""
    needs: str = ""  # what the user must provide besides rows, for errors and the catalogue
    extra: dict[str, str] = field(default_factory=dict)


PEER_ENVS: dict[str, PeerEnv] = {env.name: env for env in [
    PeerEnv("gsm8k", "GSM8K math, one reply; reward 1 when the first '#### N' equals the ground truth.",
            1, False, (0.0, 1.0), ("reward_spec.ground_truth",), tags=("math", "built-in rows")),
    PeerEnv("gsm8k_multi_turn", "GSM8K math over several turns; 1 for the right '#### N' (ends the episode), "
            "0.2/max_turns for each well-formatted wrong one, on every turn (they add up).",
            5, True, (0.0, 1.16), ("reward_spec.ground_truth",),
            tags=("math", "multi-turn", "built-in rows", "format bonus accumulates over turns")),
    PeerEnv("text2sql", "SkyRL-SQL: <sql> queries against a SQLite database, then one <solution>; 1 if its result "
            "set equals the gold query's, 0 if not, -1 for a broken format (read over the whole history).",
            5, True, (-1.0, 1.0), ("db_id", "data", "reward_spec.ground_truth"), ("db_path",),
            tags=("sql", "multi-turn", "needs database files"), io=True,
            needs="SQLite files at env.args.db_path/<spider/database|bird/train/train_databases|"
                  "SynSQL-2.5M/databases>/<db_id>/<db_id>.sqlite"),
    PeerEnv("search", "Search-R1: <search> a retrieval server, answer in <answer>; exact match on the last "
            "<answer> of the whole history.", 2, True, (0.0, 1.0), ("reward_spec.ground_truth.target",),
            ("search_url", "topk", "timeout", "log_requests"),
            tags=("search", "multi-turn", "needs retrieval server"), io=True,
            needs="a retrieval server at env.args.search_url (default http://127.0.0.1:8000/retrieve), e.g. "
                  "`skyrl-search serve`"),
    PeerEnv("aime", "AIME math, one reply; 1 if the last 'Answer: X' in the reply's last 300 characters matches, "
            "else -1.", 1, False, (-1.0, 1.0), ("reward_model.ground_truth",), tags=("math",)),
    PeerEnv("lcb", "LiveCodeBench: one reply with a Python program, run against the row's tests; 1 if all pass.",
            1, False, (0.0, 1.0), ("reward_spec.ground_truth",), tags=("code", "unsupported"), io=True,
            supported=False,
            why_unsupported="it runs the model's program with exec() inside the training process, guarded only by "
                            "a signal alarm (no isolation of files, network or memory); train code tasks on an "
                            "env that runs model code in skyrl-sandbox (rlm_repl, harbor_terminal)"),
    PeerEnv("searchcode", "Search plus a Python tool over several turns.", 2, True, (0.0, 1.0),
            ("reward_spec.ground_truth",), tags=("unsupported",), io=True, supported=False,
            why_unsupported="its python tool runs model code with `python -c` on the host, unsandboxed, and its "
                            "search tool ignores env_config (fixed URL http://127.0.0.1:8000/retrieve)"),
]}


def multi_turn_range(max_turns: int) -> tuple[float, float]:
    """gsm8k_multi_turn's episode range: max_turns - 1 formatted wrong answers, then the right one."""
    per_turn = MULTI_TURN_FORMAT_SCORE / max_turns
    top = 0.0
    for _ in range(max_turns - 1):
        top += per_turn
    return 0.0, top + 1.0


def entries() -> list[CatalogEntry]:
    """Every env skyrl-gym's registry holds, with what the bridge declares for it."""
    import skyrl_gym

    listed = []
    for name in sorted(skyrl_gym.registry):
        known = PEER_ENVS.get(name)
        if known is None:
            listed.append(CatalogEntry(name, "registered by skyrl-gym; unknown to this bridge version",
                                       tags=("unsupported",)))
            continue
        description = known.description
        if known.needs:
            description += f" Needs {known.needs}."
        if not known.supported:
            description += f" Not supported: {known.why_unsupported}."
        reward_range = multi_turn_range(known.max_turns) if name == "gsm8k_multi_turn" else known.reward_range
        listed.append(CatalogEntry(name, description, multi_turn=known.multi_turn, reward_range=reward_range,
                                   max_turns=known.max_turns, tags=known.tags))
    return listed
