"""The ``podman`` sandbox backend: skyrl-sandbox's container backend on a podman engine instead of Docker.

Registered under the ``skyrl_sandbox.backends`` entry point, so ``SKYRL_SANDBOX=podman`` and ``auto`` find it
once this package is installed. Same protections as ``docker`` (it is the same container code); podman's
API service is started on first use (see :mod:`.service`).
"""

from __future__ import annotations

from skyrl_sandbox.backends.docker import ContainerBackend

from .engine import PodmanEngine

BACKEND = ContainerBackend(
    "podman", PodmanEngine(), auto_rank=30,
    protects=("a container of a podman engine (through its Docker-API service): no network, read-only root file "
              "system, capabilities dropped, no-new-privileges, pids/memory/CPU limits, a non-root user"),
    install_hint="pip install skyrl-sandbox-podman, and apt-get install podman catatonit (run as root, or on cgroup v2)")
