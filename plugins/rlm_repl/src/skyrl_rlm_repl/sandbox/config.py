"""Configuration of the REPL sandbox: isolation backend and every resource limit."""

from __future__ import annotations

import math
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator
from skyrl_sandbox import Limits, WorkerProgram
from skyrl_sandbox.options import WorkerBackend, backend_description

# The REPL worker: this plugin's stdlib-only ``worker`` package, run inside the sandbox.
REPL_PROGRAM = WorkerProgram(module="skyrl_rlm_worker.main",
                             packages={"skyrl_rlm_worker": Path(__file__).resolve().parent / "worker"})
# Messages from the worker are JSON with ASCII escapes: a character of text takes up to 12 bytes there
# (one outside the BMP is two \uXXXX escapes). Field names, the token and numbers take a few hundred
# bytes; the overhead allowance leaves room to spare.
_BYTES_PER_CHAR = 12
_OVERHEAD_BYTES = 64 * 1024
# Text a result holds besides the code's output: the note on cut output and the traceback (the
# worker keeps at most 8,000 characters of one).
_RESULT_EXTRA_CHARS = 10_000


def message_mb_for(chars: int) -> int:
    """The smallest ``max_message_mb`` that carries a message holding ``chars`` characters of text."""
    return math.ceil((_BYTES_PER_CHAR * chars + _OVERHEAD_BYTES) / 2**20)


class SandboxConfig(BaseModel):
    """Limits and isolation of one sandbox worker process. Defaults are safe for untrusted code."""

    model_config = ConfigDict(extra="forbid")

    backend: WorkerBackend = Field("auto", description=backend_description(
        "Here it holds the REPL worker; a backend that runs images needs one with python3 (see `image`)."))
    image: str | None = Field(None, description="Image of a backend that runs images (default: skyrl-sandbox's "
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
    max_message_mb: int | None = Field(
        None, ge=1, description="Largest message accepted from the worker (results, sub-call requests); a bigger one "
        "is a protocol violation: the worker is killed and restarted, and the worker refuses to send one (the code "
        "gets an error). Default: what the largest result and FINAL request the other limits allow need (1 MiB "
        "with the defaults); the rlm_repl env raises it to carry its largest sub-call request.")
    rpc_timeout_s: float = Field(600.0, gt=0, description="Longest wait for the handler of one sub-call request.")
    start_timeout_s: float = Field(30.0, gt=0, description="Longest wait for a new worker to start and load the "
                                                            "context and scaffold.")
    pool_size: int = Field(2, ge=0, description="Workers kept pre-started so that creating a sandbox is fast "
                                                "(0: start each on demand).")
    allow_subprocesses: bool = Field(
        False, description="Let model code start processes (fork/exec/subprocess/os.system). Off: such calls raise "
        "PermissionError (audit policy and seccomp). On needs a backend that holds child processes (bwrap) and a "
        "non-root parent or a writable cgroup, because max_processes is then what stops a fork bomb and the kernel "
        "exempts root from RLIMIT_NPROC.")
    max_answer_chars: int = Field(
        20_000, ge=1, description="Longest final answer FINAL/FINAL_VAR may submit; a longer one is refused (the "
        "code gets an error saying so) and nothing is submitted.")
    echo_last_expression: bool = Field(True, description="Print the repr of a trailing bare expression, as an "
                                                         "interactive interpreter does.")

    @property
    def result_message_mb(self) -> int:
        """The cap that carries the largest result and FINAL request these limits allow.

        A result holds at most ``max_output_chars`` of output and ``_RESULT_EXTRA_CHARS`` more; a FINAL
        request at most ``max_answer_chars`` (a longer answer is refused). With the defaults (20,000
        each): 12 bytes x 30,000 characters + 64 KiB, about 0.4 MiB, so 1 MiB.
        """
        return message_mb_for(max(self.max_output_chars + _RESULT_EXTRA_CHARS, self.max_answer_chars))

    @property
    def message_mb(self) -> int:
        """The cap in force: ``max_message_mb``, else :attr:`result_message_mb`."""
        return self.max_message_mb or self.result_message_mb

    @model_validator(mode="after")
    def _results_fit_the_channel(self) -> SandboxConfig:
        if self.max_message_mb is not None and self.max_message_mb < self.result_message_mb:
            raise ValueError(f"max_message_mb={self.max_message_mb} cannot carry the largest result: "
                             f"max_output_chars={self.max_output_chars:,} and max_answer_chars="
                             f"{self.max_answer_chars:,} need {self.result_message_mb} (or leave it unset)")
        return self

    def limits(self) -> Limits:
        """The limits of the worker process, in skyrl-sandbox's terms."""
        return Limits(cpu_time_s=self.cpu_time_s, memory_mb=self.memory_mb, max_processes=self.max_processes,
                      max_open_files=self.max_open_files, max_file_size_mb=self.max_file_size_mb,
                      tmp_size_mb=self.tmp_size_mb, max_message_mb=self.message_mb)
