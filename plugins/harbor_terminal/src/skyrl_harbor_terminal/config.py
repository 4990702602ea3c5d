"""Configuration of the ``harbor_terminal`` env (``env.*`` in a run config)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from skyrl_core import EnvConfig


class HarborTerminalConfig(EnvConfig):
    """Where the tasks come from, how episodes run, and the ceilings that bind every task."""

    max_turns: int = Field(16, ge=1, description="Actions per episode (per step of a multi-step task: in total).")
    tasks: str | None = Field(None, description="A Harbor task folder, a folder of task folders, or a Parquet dataset "
                                                "(path + task_binary columns); default: the built-in tasks.")
    backend: Literal["auto", "docker", "bwrap"] = Field(
        "auto", description="Where tasks run: a Docker container of the task's image; bwrap (no Docker) for tasks "
                            "declaring [metadata.skyrl] base_packages_only; auto: docker when an engine answers.")
    command_timeout_s: float = Field(30.0, gt=0, description="Each command block is interrupted (Ctrl-C, then "
                                                             "killed) after this long.")
    agent_timeout_s: float | None = Field(None, gt=0, description="Time the agent's commands may run per step; "
                                                                  "default: the step's [agent] timeout_sec.")
    verifier_timeout_s: float | None = Field(None, gt=0, description="Default: the task's [verifier] timeout_sec.")
    verifier_cwd: str = Field("/tests", pattern=r"^(/.*|workdir)$", description=(
        "Where test.sh starts: /tests (root's, freshly copied), another absolute path, or 'workdir' for the task's "
        "work directory as Harbor does (the agent's folder: a module it left there shadows what the tests "
        "import by relative path; PYTHONSAFEPATH=1 still keeps python -m from the current folder)."))
    max_output_bytes: int = Field(8192, ge=256, description="Output kept per command block (head and tail).")
    max_commands_per_turn: int = Field(8, ge=1, description="Command blocks run per action; more are refused.")
    agent_user: str = Field("agent", description="Unprivileged user the agent's shell runs as, unless the task's "
                                                 "[agent] user says otherwise.")
    max_live_machines: int = Field(8, ge=1, description="Containers (or bwrap machines) alive at once in this "
                                                        "process; further episodes wait for one to finish.")
    starts_per_second: float = Field(4.0, gt=0, description="Rate limit of machine starts in this process.")
    max_cpus: float = Field(2.0, gt=0, description="Ceiling on a task's [environment] cpus.")
    max_memory_mb: int = Field(2048, ge=64, description="Ceiling on a task's memory_mb.")
    max_storage_mb: int = Field(4096, ge=16, description="Ceiling on a task's storage_mb.")
    max_processes: int = Field(512, ge=16, description="Processes and threads per machine (a fork bomb's ceiling).")
    allow_internet: bool = Field(False, description="Let tasks with allow_internet = true have a network (docker "
                                                    "backend; the engine must provide one). Off: they run offline.")
    build_logs: str | None = Field(None, description="Folder for image build logs; default: "
                                                     "~/.cache/skyrl/harbor/build-logs.")
