"""What the task lint's rules share: where a script stands (:class:`Context`) and the fix they suggest."""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass, field, replace

DECLARE = ("read the agent's files as data instead; or, if running its code is the point, run it as the agent "
           "user (setpriv --reuid=agent --regid=agent --clear-groups) and declare [metadata.skyrl] "
           "tests_run_agent_code = true")
PRIVILEGES = "with the tests' privileges (root by default), so it can write the reward"

Hit = tuple[str, str]  # (rule, message)

_VARIABLE = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")


@dataclass
class Context:
    """Where a script stands: the work directory, the other folders the agent can write (``roots``), its current
    directory (None: unknown) and known variables."""

    workdir: str
    cwd: str | None = None
    variables: dict[str, str] = field(default_factory=dict)
    roots: tuple[str, ...] = ()

    @property
    def in_workdir(self) -> bool:
        return self.cwd is not None and self.inside(self.cwd)

    def inside(self, path: str) -> bool:
        return any(path == root or path.startswith(root.rstrip("/") + "/") for root in (self.workdir, *self.roots))

    def resolve(self, word: str) -> str | None:
        """The absolute path ``word`` names, or None when it is an option, a variable or relative to an unknown cwd."""
        if not word or word[0] in "-$~":
            return None
        if not word.startswith("/"):
            if self.cwd is None:
                return None
            word = posixpath.join(self.cwd, word)
        return posixpath.normpath(word)

    def agent(self, word: str) -> bool:
        path = self.resolve(word)
        return path is not None and self.inside(path)

    def cd(self, target: str | None) -> None:
        self.cwd = self.resolve(target) if target else None

    def expand(self, word: str) -> str:
        return _VARIABLE.sub(lambda m: self.variables.get(m.group(1) or m.group(2), m.group(0)), word)

    def copy(self, cwd: str | None = None) -> Context:
        """A context for a nested command (``bash -c``, a Python call), so its cd and variables stay in it."""
        return replace(self, cwd=cwd or self.cwd, variables=dict(self.variables))
