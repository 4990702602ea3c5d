"""One-line notices before slow steps, and silence for other libraries' progress bars.

A step of ours that takes more than a few seconds (converting the embedded default model, building
a search index) first says so on one stderr line with the time it is expected to take, so that a
quiet terminal never looks like a hang. Libraries we call draw their own tqdm bars on stderr, which
would land in the middle of ``skyrl check``'s report; :func:`quiet_progress_bars` turns them off
for the length of such a step (our notice, or our own bar, says what is going on instead).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO

SLOW_STEP_S = 3.0
"""A step expected to take at least this long gets a notice (:func:`announce_slow_step`)."""


def format_duration(seconds: float) -> str:
    """``"5 s"``, ``"40 s"``, ``"3 min"``, ``"1.5 h"``: a rough duration for a message."""
    if seconds < 60:
        return f"{max(1, round(seconds))} s"
    if seconds < 3600:
        return f"{round(seconds / 60)} min"
    return f"{seconds / 3600:.1f} h"


def announce(message: str, expected_s: float | None = None, *, source: str = "skyrl",
             stream: TextIO | None = None) -> None:
    """Print ``<source>: <message> (about <expected time>)`` as one line on stderr."""
    line = f"{source}: {message}" + (f" (about {format_duration(expected_s)})" if expected_s is not None else "")
    print(line, file=stream or sys.stderr, flush=True)


def announce_slow_step(message: str, expected_s: float, *, source: str = "skyrl",
                       stream: TextIO | None = None) -> bool:
    """:func:`announce` the step when it is expected to take :data:`SLOW_STEP_S` or more; True if it did."""
    if expected_s < SLOW_STEP_S:
        return False
    announce(message, expected_s, source=source, stream=stream)
    return True


@contextmanager
def quiet_progress_bars() -> Iterator[None]:
    """Turn off every tqdm bar (any library's, in every thread: transformers', huggingface_hub's and
    bm25s' bars are all tqdm subclasses) and transformers' warnings while the block runs; both are
    restored afterwards.

    tqdm is imported when installed (a library may import it inside the block); transformers is
    touched only when it is already imported, never imported here.
    """
    restore: list[Any] = []
    try:
        try:
            import tqdm.std as tqdm_std
        except ImportError:
            tqdm_std = None
        if tqdm_std is not None:
            restore.append(_disable_tqdm(tqdm_std.tqdm))
        transformers_logging = sys.modules.get("transformers.utils.logging")
        if transformers_logging is not None:
            restore.append(_quiet_transformers(transformers_logging))
        yield
    finally:
        for undo in reversed(restore):
            undo()


def _disable_tqdm(tqdm_class: Any) -> Any:
    original = tqdm_class.__init__

    def quiet_init(self: Any, *args: Any, **kwargs: Any) -> None:
        if len(args) <= 10:  # ``disable`` is tqdm's 11th positional parameter
            kwargs["disable"] = True
        original(self, *args, **kwargs)

    tqdm_class.__init__ = quiet_init

    def undo() -> None:
        tqdm_class.__init__ = original

    return undo


def _quiet_transformers(logging: Any) -> Any:
    bars, verbosity = logging.is_progress_bar_enabled(), logging.get_verbosity()
    logging.disable_progress_bar()
    logging.set_verbosity_error()

    def undo() -> None:
        logging.set_verbosity(verbosity)
        if bars:
            logging.enable_progress_bar()

    return undo
