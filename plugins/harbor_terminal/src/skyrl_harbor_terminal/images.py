"""The terminal base image: Debian minbase with the tools shell tasks expect, built locally.

Built tasks start ``FROM`` :data:`TERMINAL_IMAGE`; it is built from Debian packages the first time
a task image needs it (about 40 s), or ahead of time with ``python -m skyrl_harbor_terminal.images``
(``scripts/setup.sh`` does). Nothing is pulled from a registry.
"""

from __future__ import annotations

import sys

from skyrl_sandbox.backends.docker import images
from skyrl_sandbox.errors import SandboxError

TERMINAL_IMAGE = images.register_base_image(
    "skyrl-terminal-base:bookworm-1",
    ("python3", "git", "procps", "psmisc", "jq", "bc", "xz-utils", "patch", "less"))


def main() -> int:
    """Build the terminal base image unless the engine (of the first installed backend that runs images) has it."""
    try:
        images.ensure_base_image(images.image_engine(), TERMINAL_IMAGE, progress=lambda line: print(line, flush=True))
    except SandboxError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
