"""Resource limits of one sandbox, shared by every backend (defaults are safe for untrusted code)."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Limits:
    """What one sandbox may use. Each limit that is hit is reported in words by what hit it.

    ``max_processes`` counts threads too; ``memory_mb`` is the address space of each process, and
    with a memory cgroup (or Docker) ``memory_mb + tmp_size_mb`` bounds every page the sandbox can
    pin, tmpfs included.
    """

    cpu_time_s: int = 60
    memory_mb: int = 1024
    max_processes: int = 32
    max_open_files: int = 256
    max_file_size_mb: int = 16
    tmp_size_mb: int = 64
    max_message_mb: int = 32

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"Limits.{name} must be a positive integer, got {value!r}")

    @property
    def max_message_bytes(self) -> int:
        return self.max_message_mb * 2**20

    @property
    def pinned_memory_bytes(self) -> int:
        """Every page the sandbox can hold: its address space plus its private tmpfs."""
        return (self.memory_mb + self.tmp_size_mb) * 2**20

    @property
    def spawn_key(self) -> tuple[int, ...]:
        """The limits fixed when a worker starts (mounts, cgroups, channel); the rest it applies at init."""
        return (self.tmp_size_mb, self.max_message_mb, self.memory_mb, self.max_processes)

    def rlimits(self) -> dict[str, int]:
        """The limits a worker applies to itself (see ``skyrl_sandbox_runtime.kernel.apply_limits``)."""
        return {"cpu_time_s": self.cpu_time_s, "memory_bytes": self.memory_mb * 2**20,
                "max_processes": self.max_processes, "max_open_files": self.max_open_files,
                "max_file_size_bytes": self.max_file_size_mb * 2**20}
