"""Configuration of the REPL sandbox: isolation backend and every resource limit."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from skyrl_sandbox import Limits, WorkerProgram

# The REPL worker: this plugin's stdlib-only ``worker`` package, run inside the sandbox.
REPL_PROGRAM = WorkerProgram(module="skyrl_rlm_worker.main",
                             packages={"skyrl_rlm_worker": Path(__file__).resolve().parent / "worker"})


class SandboxConfig(BaseModel):
    """Limits and isolation of one sandbox worker process. Defaults are safe for untrusted code."""

    model_config = ConfigDict(extra="forbid")

    backend: Literal["auto", "bwrap", "docker", "subprocess"] = Field(
        "auto", description="'bwrap': bubblewrap namespaces (no network, private /tmp, read-only system files); "
        "'docker': a locked-down container of a local Docker Engine (needs an image with python3, see `image`); "
        "'subprocess': a resource-limited child process with a clean environment (weaker, opt-in only: relies on an "
        "in-process policy for files and network, which determined code can defeat); 'auto': bwrap, else docker, "
        "and an error saying what is missing where neither runs (never a silent fallback). "
        "SKYRL_SANDBOX=bwrap|docker|subprocess requires one backend for the whole run.")
    image: str | None = Field(None, description="Docker image of the docker backend (default: skyrl-sandbox's "
                                                "base image, built locally on first use).")
    exec_timeout_s: float = Field(
        10.0, gt=0, description="Wall-clock limit of the code's own running time, enforced from outside: the worker "
        "is killed and restarted (its variables are lost, and the result says so). Time spent waiting for the "
        "handler of an llm_query/rlm_query request does not count here; callers bound it with a deadline (the "
        "rlm_repl env: step_timeout_s). The rlm_repl env gives this budget to a whole response, across its blocks.")
    cpu_time_s: int = Field(60, ge=1, description="CPU seconds the worker may use in its lifetime (RLIMIT_CPU).")
    memory_mb: int = Field(1024, ge=64, description="Address-space limit of the worker (RLIMIT_AS); with a memory "
                                                    "cgroup, memory_mb + tmp_size_mb bounds every page it can pin.")
    max_processes: int = Field(
        32, ge=1, description="Threads and processes of the worker: a pids cgroup where one is writable (binds for "
        "root too), and RLIMIT_NPROC (which the kernel does not apply to root).")
    max_open_files: int = Field(256, ge=16, description="Open file descriptors of the worker (RLIMIT_NOFILE).")
    max_file_size_mb: int = Field(16, ge=1, description="Largest file the worker may write (RLIMIT_FSIZE).")
    max_output_chars: int = Field(
        20_000, ge=100, description="stdout+stderr kept per execute(); the rest is cut and a note says how many "
        "characters were cut.")
    tmp_size_mb: int = Field(64, ge=1, description="Size of the private writable /tmp (bwrap backend: a tmpfs).")
    max_message_mb: int = Field(
        32, ge=1, description="Largest message accepted from the worker (results, sub-call requests); a bigger one "
        "is a protocol violation: the worker is killed and restarted.")
    rpc_timeout_s: float = Field(600.0, gt=0, description="Longest wait for the handler of one sub-call request.")
    start_timeout_s: float = Field(30.0, gt=0, description="Longest wait for a new worker to start and load the "
                                                            "context and scaffold.")
    pool_size: int = Field(2, ge=0, description="Workers kept pre-started so that creating a sandbox is fast "
                                                "(0: start each on demand).")
    allow_subprocesses: bool = Field(
        False, description="Let model code start processes (fork/exec/subprocess/os.system). Off: such calls raise "
        "PermissionError (audit policy and seccomp). On needs the bwrap backend and a non-root parent, because "
        "max_processes (RLIMIT_NPROC) is then what stops a fork bomb and the kernel exempts root from it.")
    max_answer_chars: int = Field(
        20_000, ge=1, description="Longest final answer FINAL/FINAL_VAR may submit; a longer one is refused (the "
        "code gets an error saying so) and nothing is submitted.")
    echo_last_expression: bool = Field(True, description="Print the repr of a trailing bare expression, as an "
                                                         "interactive interpreter does.")

    def limits(self) -> Limits:
        """The limits of the worker process, in skyrl-sandbox's terms."""
        return Limits(cpu_time_s=self.cpu_time_s, memory_mb=self.memory_mb, max_processes=self.max_processes,
                      max_open_files=self.max_open_files, max_file_size_mb=self.max_file_size_mb,
                      tmp_size_mb=self.tmp_size_mb, max_message_mb=self.max_message_mb)
