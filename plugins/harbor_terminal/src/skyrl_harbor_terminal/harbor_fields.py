"""Harbor's task.toml fields that change where and with what network a task runs, read or refused by name.

- ``network_mode`` (``[environment]``, ``[agent]``, ``[verifier]``, and a step's ``agent``/``verifier``):
  "public" is a network, "no-network" none; it wins over the older ``allow_internet``. "allowlist" and
  ``allowed_hosts`` are refused: a machine here has the whole network or none.
- ``[verifier] environment_mode``: "shared" (the tests run in the agent's machine) or "separate" (in a
  machine of their own, see :class:`~skyrl_harbor_terminal.task_model.VerifierMachine`); a
  ``[verifier.environment]`` table and a compose file among the tests are refused.
- ``[verifier] collect``: commands run in the agent's machine before its artifacts are copied out; one
  aimed at another compose service is refused.

The reader is the loader's (:mod:`.task`): its errors and warnings name the task folder, table and key.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from .task_errors import TaskFormatError
from .task_model import CollectHook, VerifierMachine

NETWORK_MODES = {"public": True, "no-network": False}
VERIFIER_MODES = ("shared", "separate")
COLLECT_KEYS = {"command", "service", "timeout_sec", "user"}
COLLECT_TIMEOUT_SEC = 60.0
MAIN_SERVICE = "main"
_COMPOSE_FILES = ("docker-compose.yaml", "docker-compose.yml", "compose.yaml", "compose.yml")


class Reader(Protocol):
    def error(self, where: str, message: str) -> TaskFormatError: ...
    def warn(self, message: str) -> None: ...
    def check_keys(self, table: dict[str, Any], allowed: set[str], where: str) -> None: ...
    def number(self, table: dict[str, Any], key: str, where: str, default: float) -> float: ...
    def string(self, table: dict[str, Any], key: str, where: str) -> str | None: ...
    def boolean(self, table: dict[str, Any], key: str, where: str, default: bool) -> bool: ...


def network_mode(reader: Reader, table: dict[str, Any], where: str) -> bool | None:
    """Whether ``table``'s ``network_mode`` asks for a network; None when it does not say."""
    if "allowed_hosts" in table:
        raise reader.error(where, "allowed_hosts is not supported: a machine here has the whole network or none; "
                                  "remove it and set network_mode = \"public\" or \"no-network\"")
    value = table.get("network_mode")
    if value is None:
        return None
    if value == "allowlist":
        raise reader.error(where, "network_mode = \"allowlist\" is not supported: a machine here has the whole "
                                  "network or none; use \"public\" or \"no-network\"")
    if value not in NETWORK_MODES:
        raise reader.error(where, f"network_mode must be \"public\" or \"no-network\", got {value!r}")
    return NETWORK_MODES[value]


def environment_network(reader: Reader, environment: dict[str, Any]) -> bool:
    """``[environment]``: network_mode, else the older allow_internet, else no network (Harbor: public)."""
    mode = network_mode(reader, environment, "[environment]")
    legacy = reader.boolean(environment, "allow_internet", "[environment]", bool(mode))
    if mode is None:
        return legacy
    if "allow_internet" in environment and legacy != mode:
        reader.warn(f"[environment]: allow_internet = {str(legacy).lower()} is overridden by network_mode = "
                    f"\"{environment['network_mode']}\"")
    return mode


def verifier_mode(reader: Reader, verifier: dict[str, Any], where: str) -> str | None:
    """``environment_mode`` of a ``[verifier]`` table; None when it does not say."""
    if "environment" in verifier:
        raise reader.error(where, "environment (a table defining the tests' own machine) is not supported: put "
                                  "the tests image's Dockerfile in tests/Dockerfile and set environment_mode = "
                                  "\"separate\"")
    value = verifier.get("environment_mode")
    if value is not None and value not in VERIFIER_MODES:
        raise reader.error(where, f"environment_mode must be \"shared\" or \"separate\", got {value!r}")
    return value


def collect_hooks(reader: Reader, verifier: dict[str, Any], where: str) -> tuple[CollectHook, ...]:
    """``[[verifier.collect]]`` tables: {command, service = "main", timeout_sec = 60, user}."""
    raw = verifier.get("collect", [])
    if not isinstance(raw, list) or not all(isinstance(entry, dict) for entry in raw):
        raise reader.error(where, "collect must be a list of {command, service, timeout_sec, user} tables "
                                  "([[verifier.collect]])")
    hooks = []
    for index, entry in enumerate(raw):
        at = f"{where} collect[{index}]"
        reader.check_keys(entry, COLLECT_KEYS, at)
        command = reader.string(entry, "command", at)
        if command is None or not command.strip():
            raise reader.error(at, "needs a command (a shell command run in the agent's machine)")
        service = reader.string(entry, "service", at) or MAIN_SERVICE
        if service != MAIN_SERVICE:
            raise reader.error(at, f"service = {service!r} is not supported: collect commands run only in the "
                                   f"agent's machine (service \"main\"), not in a compose service")
        user = entry.get("user")
        if user is not None and (isinstance(user, bool) or not isinstance(user, str | int) or user == ""):
            raise reader.error(at, f"user must be a user name or a UID, got {user!r}")
        hooks.append(CollectHook(command, reader.number(entry, "timeout_sec", at, COLLECT_TIMEOUT_SEC),
                                 None if user is None else str(user)))
    return tuple(hooks)


def verifier_machine(reader: Reader, where: str, tests_dirs: Sequence[Path], mode: str | None,
                     tests_network: bool | None, machine_network: bool, baseline_network: bool
                     ) -> VerifierMachine | None:
    """The step's own tests machine in separate mode (None: shared, the tests run in the agent's machine).

    The tests image is the last of ``tests_dirs`` (the step's own tests folder first) with a Dockerfile, else the
    task's image. Its network: the verifier's network_mode, else ``[environment]``'s (``baseline_network``).
    """
    if mode != "separate":
        if tests_network is not None and tests_network != machine_network:
            have = "a network" if machine_network else "no network"
            raise reader.error(where, f"network_mode differs from the agent's machine ({have}), where the tests "
                                      f"run: make them agree, or set environment_mode = \"separate\"")
        return None
    context = None
    for folder in reversed(tests_dirs):
        compose = [name for name in _COMPOSE_FILES if (folder / name).is_file()]
        if compose:
            raise reader.error(where, f"environment_mode = \"separate\" with {folder.name}/{compose[0]} is not "
                                      f"supported: the tests machine is built from {folder.name}/Dockerfile only")
        if (folder / "Dockerfile").is_file():
            context = folder
            break
    return VerifierMachine(context, baseline_network if tests_network is None else tests_network)
