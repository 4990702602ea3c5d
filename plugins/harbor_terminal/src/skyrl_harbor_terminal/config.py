"""Configuration of the ``harbor_terminal`` env (``env.*`` in a run config)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator
from skyrl_core import EnvConfig
from skyrl_sandbox.options import MachineBackend, backend_description

from .rewards import weights_problem


class HarborTerminalConfig(EnvConfig):
    """Where the tasks come from, how episodes run, and the ceilings that bind every task."""

    max_turns: int = Field(16, ge=1, description="Actions per episode (per step of a multi-step task: in total).")
    tasks: str | None = Field(None, description="A Harbor task folder, a folder of task folders, or a Parquet dataset "
                                                "(path + task_binary columns); default: the built-in tasks.")
    forgeable_tasks: Literal["skip", "include"] = Field("skip", description=(
        "Tasks whose tests run files the agent can write with the tests' privileges (the task lint's agent-code, "
        "agent-path and agent-tests findings), so a policy could write its own reward: 'skip' leaves them out (one "
        "line names them); 'include' plays them, marked [forgeable]. skyrl run defaults to 'skip'; skyrl eval and "
        "skyrl rollout default to 'include'."))
    backend: MachineBackend = Field("auto", description=backend_description(
        "Where tasks run: a backend that runs images starts a container of the task's image; one that runs the "
        "host's tools replays the task's Dockerfile on them, for tasks declaring [metadata.skyrl] "
        "base_packages_only. Here auto picks the first backend that runs images whose engine answers (and whose "
        "base image is there or can be built), else, for such tasks, the first that runs the host's tools.",
        machines=True))
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
    max_live_machines: int = Field(8, ge=1, description="Machines alive at once in this process; further episodes "
                                                        "wait for one to finish.")
    starts_per_second: float = Field(4.0, gt=0, description="Rate limit of machine starts in this process.")
    max_cpus: float = Field(2.0, gt=0, description="Ceiling on a task's [environment] cpus.")
    max_memory_mb: int = Field(2048, ge=64, description="Ceiling on a task's memory_mb.")
    max_storage_mb: int = Field(4096, ge=16, description="Ceiling on a task's storage_mb.")
    max_processes: int = Field(512, ge=16, description="Processes and threads per machine (a fork bomb's ceiling).")
    allow_internet: bool = Field(False, description="Let tasks with allow_internet = true have a network (a "
                                                    "backend that runs images; its engine must provide one). Off: "
                                                    "they run offline.")
    build_logs: str | None = Field(None, description="Folder for image build logs; default: "
                                                     "~/.cache/skyrl/harbor/build-logs.")
    substitute_images: bool | None = Field(None, description=(
        "Build public images that task Dockerfiles start FROM (debian:, python:, ubuntu:) and the engine lacks "
        "from Debian packages (docs/packages/harbor_terminal.md, 'Offline base images'); an image on the engine "
        "is used as it is. None: "
        "$SKYRL_SUBSTITUTE_IMAGES when set (1/0), else the machine's settings file "
        "(~/.config/skyrl/harbor.toml), else on."))
    build_network: bool | None = Field(None, description=(
        "RUN steps of task image builds (never the agent's machine) use the host's network, so apt-get and pip "
        "install work where this machine reaches package mirrors. None: $SKYRL_BUILD_NETWORK when set, else the "
        "machine's settings file (~/.config/skyrl/harbor.toml; scripts/setup.sh turns it on), else off."))
    build_ca_bundle: str | None = Field(None, description=(
        "CAs that RUN steps of image builds with build_network trust besides the public ones (never the agent's "
        "machine), for egress through a TLS-intercepting proxy: a PEM file; 'auto': the system store's local "
        "additions (/usr/local/share/ca-certificates), else $SSL_CERT_FILE; 'none': off. None: "
        "$SKYRL_BUILD_CA_BUNDLE when set, else auto."))
    reward_weights: dict[str, float] | None = Field(None, description=(
        "Weights of a reward.json's keys when it has no 'reward' key (e.g. {correctness: 0.7, performance: 0.3}); "
        "overrides the task's [metadata.skyrl] reward_weights. None: the task's, else equal weights."))
    artifacts_dir: str | None = Field(None, description=(
        "Where a task's artifacts are copied (<dir>/<task>/<episode>/<step>/...); default: "
        "$SKYRL_HARBOR_CACHE/artifacts, else ~/.cache/skyrl/harbor/artifacts."))
    max_artifact_bytes: int = Field(16 * 2**20, ge=0, description="Artifact bytes kept per episode; the rest is "
                                                                  "cut (info['artifacts'] says so). 0: none collected.")

    @field_validator("reward_weights")
    @classmethod
    def _check_reward_weights(cls, weights: dict[str, float] | None) -> dict[str, float] | None:
        problem = None if weights is None else weights_problem(weights)
        if problem:
            raise ValueError(f"env.reward_weights {problem}")
        return weights
