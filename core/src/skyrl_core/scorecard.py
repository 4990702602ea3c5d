"""Scorecards for whole catalogues: conformance and reward-hacking probes on every env a bridge hosts.

``skyrl check ID --catalog`` plays :func:`~skyrl_core.testing.check_env` and (with ``--adversarial``)
:func:`~skyrl_core.testing.check_adversarial` on each catalogue entry, ``env.name`` set to the entry's name,
and prints one row per peer env. Each env is scored in a child process of its own (forked where the platform
allows), so one that hangs, crashes or exhausts memory costs its row, never the scorecard.
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from skyrl_core.catalog import catalog_entries
from skyrl_core.registry import RegistryError, did_you_mean


@dataclass
class ScoreRow:
    """One peer env's scorecard row.

    ``conformance`` is ``"pass"`` or ``"fail"`` (``failed`` lists the checks), or ``"error"`` when the env
    could not be checked at all (``error`` says why: a missing corpus, a timeout, a crash). ``flagged``
    names the probes that scored above the null agent (``reasons``: one line each, and state leaks);
    ``gold`` is ``"reached"`` (every checked task's gold actions reached its ceiling), ``"missed"``, or
    ``"none"`` (the env gives no gold actions, so the near-miss probes cannot run).
    """

    name: str
    conformance: str = "error"
    failed: list[str] = field(default_factory=list)
    flagged: list[str] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    gold: str = "none"
    probed: bool = False
    seconds: float = 0.0
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.conformance == "pass" and not self.flagged and not self.error

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


def score_catalog(env_id: str, options: Mapping[str, Any] | None = None, names: Sequence[str] | None = None, *,
                  adversarial: bool = False, quick: bool = True, n_tasks: int = 2, seed: int = 0,
                  skip: Collection[str] = (), timeout_s: float = 300.0,
                  progress: Callable[[int, int, str], None] | None = None) -> list[ScoreRow]:
    """Score ``names`` (default: the whole catalogue of ``env_id``), one child process each.

    ``options`` are env options applied to every entry (``name`` is set per entry). ``skip`` names checks
    (and, with ``adversarial``, probes) left out everywhere. ``progress(done, total, name)`` is called as
    each env finishes.
    """
    entries = [entry.name for entry in catalog_entries(env_id)]
    chosen = list(names) if names else entries
    unknown = [name for name in chosen if name not in entries]
    if unknown:
        raise RegistryError(f"{env_id}: no catalogue env {unknown[0]!r}.{did_you_mean(unknown[0], entries)} "
                            f"See `skyrl envs --catalog {env_id}`.")
    rows = []
    for done, name in enumerate(chosen, start=1):
        job = dict(env_id=env_id, options={**dict(options or {}), "name": name}, adversarial=adversarial,
                   quick=quick, n_tasks=n_tasks, seed=seed, skip=tuple(skip))
        rows.append(_in_child(name, job, timeout_s))
        if progress is not None:
            progress(done, len(chosen), name)
    return rows


def score_one(env_id: str, options: dict[str, Any], adversarial: bool, quick: bool, n_tasks: int, seed: int,
              skip: tuple[str, ...]) -> ScoreRow:
    """The scorecard row of one env (in this process)."""
    from skyrl_core.testing import check_adversarial, check_env
    from skyrl_core.testing.check import SKIPPABLE, check_family

    started = time.perf_counter()
    row = ScoreRow(str(options["name"]))
    checks = {name for name in skip if check_family(name) in SKIPPABLE}
    try:
        report = check_env(env_id, config=options, n_tasks=n_tasks, seed=seed, skip=checks, raise_on_failure=False)
        row.conformance = "fail" if report.failed else "pass"
        row.failed = list(report.failed)
        missed = any(failure.startswith("gold[") for failure in report.failed)
        reached = any(check.startswith("gold[") for check in report.passed)
        row.gold = "missed" if missed else "reached" if reached else "none"
        if adversarial:
            probes = set(skip) - checks
            found = check_adversarial(env_id, config=options, n_tasks=n_tasks, seed=seed, quick=quick,
                                      skip=probes & _probe_names(env_id))
            row.probed = True
            row.flagged = [outcome.probe for outcome in found.flagged] + (["state_leak"] if found.leaks else [])
            row.reasons = found.problems()
    except Exception as exc:  # noqa: BLE001 - one env's failure is its row, never the scorecard's
        row.error = f"{type(exc).__name__}: {exc}"
    row.seconds = round(time.perf_counter() - started, 2)
    return row


def _probe_names(env_id: str) -> set[str]:
    from skyrl_core.testing.adversarial import GENERIC_PROBES, registered_probes

    return {probe.name for probe in (*GENERIC_PROBES, *registered_probes(env_id))}


def _child(connection: Any, job: dict[str, Any]) -> None:
    try:
        connection.send(score_one(**job).to_dict())
    except BaseException as exc:  # noqa: BLE001 - reported to the parent as the row's error
        connection.send({"name": job["options"]["name"], "error": f"{type(exc).__name__}: {exc}"})
    finally:
        connection.close()


def _in_child(name: str, job: dict[str, Any], timeout_s: float) -> ScoreRow:
    """:func:`score_one` in a child process; a child that times out or dies gives an ``error`` row."""
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    receiving, sending = context.Pipe(duplex=False)
    started = time.perf_counter()
    child = context.Process(target=_child, args=(sending, job), daemon=True)
    child.start()
    sending.close()
    try:
        if receiving.poll(timeout_s):
            record = receiving.recv()
            record.pop("ok", None)
            return ScoreRow(**record)
        why = f"timed out after {timeout_s:g} s"
    except EOFError:
        why = "the check process died"
    finally:
        receiving.close()
        if child.is_alive():
            child.kill()
        child.join(5)
    if child.exitcode not in (None, 0) and why == "the check process died":
        why += f" (exit code {child.exitcode})"
    return ScoreRow(name, error=why, seconds=round(time.perf_counter() - started, 2))
