"""A persistent shell on a terminal: commands run one after another in one ``bash``, as a person types them.

The shell is an interactive ``bash --noprofile --norc --noediting`` on a pseudo-terminal (a pty
here for bwrap, the engine's tty of a ``docker exec`` for Docker), so state such as the working
directory, variables and functions carries over between commands, programs see a terminal, and a
time-out is a Ctrl-C, as in a terminal. Each command travels base64-encoded on short lines (a
terminal line holds at most 4095 bytes) and runs with stdin from ``/dev/null``, so a program that
reads its input gets end-of-file instead of eating the next command. A marker with a fresh random
token after each command gives its exit status; the shell is told not to echo, prompt or keep a
history.

When Ctrl-C does not bring the shell back (a command ignoring SIGINT, a shell that trapped it),
the terminal's foreground process group is killed; when even that fails, or the shell exited, the
shell is started again and the result says so (its state is lost). Output is kept to a head and a
tail of bounded size whatever the command prints, with escape sequences and carriage-return
overwrites resolved as a terminal would show them.
"""

from __future__ import annotations

import asyncio
import base64
import re
import secrets
import shlex
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

# +o history: no history file is read at start (one the agent made a FIFO would hang every new shell).
SHELL_ARGV = ["bash", "--noprofile", "--norc", "--noediting", "+o", "history", "-i"]
_CHUNK = 1000  # base64 characters per typed line
_INTERRUPT_GRACE_S = 2.0
_START_TIMEOUT_S = 20.0
_MARKER = "__SKYRL_"
_STALE_MARKER = re.compile(rb"\n?__SKYRL_[0-9a-f]{16} -?\d+\r?\n")  # of an interrupt's second try
_ANSI = re.compile(rb"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\-_])")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


class TerminalTransport(Protocol):
    """The byte stream of one shell's terminal and what can be done to it from outside."""

    async def read(self) -> bytes:
        """Some output (``b""`` once the terminal is closed)."""

    def write(self, data: bytes) -> None:
        """Type ``data`` into the terminal."""

    async def kill_foreground(self, shell_pid: int) -> bool:
        """SIGKILL the terminal's foreground process group unless it is the shell's (``shell_pid``, as the
        shell's namespace numbers it); whether one was killed."""

    async def close(self) -> None:
        """Kill the shell and whatever holds its terminal."""


@dataclass
class CommandResult:
    """What one command printed (stdout and stderr as a terminal interleaves them) and how it ended."""

    output: str
    exit_code: int | None  # None when the command was interrupted or the shell was lost
    timed_out: bool
    omitted_bytes: int  # output dropped from the middle (see TerminalSession.max_output_bytes)
    shell_restarted: bool  # the shell exited or could not be stopped, and was started again
    duration_s: float


class _Output:
    """Keeps the first and the last ``limit // 2`` bytes of a stream and counts what fell between."""

    def __init__(self, limit: int) -> None:
        self.half = max(limit // 2, 1)
        self.head = bytearray()
        self.tail = bytearray()
        self.dropped = 0

    def add(self, data: bytes) -> None:
        room = self.half - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        self.tail += data
        excess = len(self.tail) - self.half
        if excess > 0:
            del self.tail[:excess]
            self.dropped += excess

    def text(self) -> tuple[str, int]:
        head, tail = clean_output(bytes(self.head)), clean_output(bytes(self.tail))
        if self.dropped:
            return f"{head}\n[... {self.dropped:,} bytes of output omitted ...]\n{tail}", self.dropped
        return head + tail, 0


def clean_output(data: bytes) -> str:
    """What a terminal would show: escape sequences removed, ``\\r`` overwrites resolved, text decoded."""
    text = _ANSI.sub(b"", _STALE_MARKER.sub(b"\n", data)).decode("utf-8", "replace").replace("\r\n", "\n")
    lines = [line.rsplit("\r", 1)[-1] if "\r" in line.rstrip("\r") else line.rstrip("\r")
             for line in text.split("\n")]
    return _CONTROL.sub("", "\n".join(lines))


class TerminalSession:
    """One persistent shell; start with :meth:`start`, then :meth:`run` commands one at a time."""

    def __init__(self, open_transport: Callable[[], Awaitable[TerminalTransport]], *,
                 max_output_bytes: int = 16 * 1024, workdir: str | None = None) -> None:
        self._open_transport = open_transport
        self.max_output_bytes = max_output_bytes
        self.workdir = workdir  # entered by the shell itself: one the agent made unenterable leaves it in /
        self._transport: TerminalTransport | None = None
        self._pending = bytearray()  # read past the last marker
        self._lock = asyncio.Lock()
        self.shell_pid: int | None = None  # as the shell's own PID namespace numbers it
        self.restarts = 0

    async def start(self) -> None:
        """Open the terminal and wait until the shell answers (raises TimeoutError/ConnectionError)."""
        self._transport = await self._open_transport()
        self._pending.clear()
        token = secrets.token_hex(8)
        enter = f"cd -- {shlex.quote(self.workdir)} 2>/dev/null || cd /; " if self.workdir else ""
        setup = (f"stty -echo -onlcr 2>/dev/null; {enter}PS1=; PS2=; PS0=; PROMPT_COMMAND=; unset HISTFILE; "
                 "set +o history; export PAGER=cat GIT_PAGER=cat; "
                 f"printf '\\n%s%s %s\\n' {_MARKER}READY_ {token} $$\n")
        self._transport.write(setup.encode())
        status, _ = await self._wait_marker(f"READY_{token}", time.monotonic() + _START_TIMEOUT_S, _Output(4096))
        if status is None:
            raise TimeoutError("the shell did not start")
        self.shell_pid = status

    async def run(self, command: str, timeout_s: float) -> CommandResult:
        """Run ``command`` (any bash, several lines allowed) in the shell; never raises for what it does."""
        async with self._lock:
            started = time.monotonic()
            if self._transport is None:
                await self._restart()
            assert self._transport is not None
            token = secrets.token_hex(8)
            encoded = base64.b64encode(command.encode()).decode()
            lines = ["__skyrl_b="] + [f"__skyrl_b+={encoded[i:i + _CHUNK]}" for i in range(0, len(encoded), _CHUNK)]
            lines.append('__skyrl_c=$(printf %s "$__skyrl_b" | base64 -d); unset __skyrl_b; '
                         'eval "$__skyrl_c" </dev/null')
            lines.append(f"printf '\\n%s%s %d\\n' {_MARKER} {token} $?")
            output = _Output(self.max_output_bytes)
            self._transport.write(("\n".join(lines) + "\n").encode())
            status, closed = await self._wait_marker(token, started + timeout_s, output)
            timed_out = restarted = False
            if status is None:
                timed_out = not closed
                restarted = closed or not await self._interrupt(output)
                if restarted:
                    await self._restart()
            text, omitted = output.text()
            return CommandResult(text.strip("\n"), status, timed_out, omitted, restarted, time.monotonic() - started)

    async def close(self) -> None:
        transport, self._transport = self._transport, None
        if transport is not None:
            await transport.close()

    async def _interrupt(self, output: _Output) -> bool:
        """Ctrl-C, then a kill of the foreground job; whether the shell answers again."""
        assert self._transport is not None
        token = secrets.token_hex(8)  # one for both tries: the first try's marker may come after the kill
        for attempt in range(2):
            if attempt:
                try:
                    if self.shell_pid is None or not await self._transport.kill_foreground(self.shell_pid):
                        return False
                except Exception:  # noqa: BLE001 - a failed kill is answered by a restart
                    return False
            else:
                self._transport.write(b"\x03")
                await asyncio.sleep(0.05)
            self._transport.write(f"\nprintf '\\n%s%s %d\\n' {_MARKER} {token} 0\n".encode())
            status, closed = await self._wait_marker(token, time.monotonic() + _INTERRUPT_GRACE_S, output)
            if closed:
                return False
            if status is not None:
                return True
        return False

    async def _restart(self) -> None:
        await self.close()
        self.restarts += 1
        await self.start()

    async def _wait_marker(self, token: str, deadline: float, output: _Output) -> tuple[int | None, bool]:
        """Read until ``token``'s marker: (its number, False), or (None, closed) at the deadline or on EOF."""
        assert self._transport is not None
        pattern = re.compile(rb"\n?" + re.escape(f"{_MARKER}{token} ".encode()) + rb"(-?\d+)\r?\n")
        buffer = bytearray(self._pending)
        self._pending.clear()
        while True:
            match = pattern.search(buffer)
            if match:
                output.add(bytes(buffer[:match.start()]))
                self._pending += buffer[match.end():]
                return int(match.group(1)), False
            keep = 200  # a marker split across reads
            if len(buffer) > keep:
                output.add(bytes(buffer[:-keep]))
                del buffer[:-keep]
            left = deadline - time.monotonic()
            if left <= 0:
                output.add(bytes(buffer))
                return None, False
            try:
                chunk = await asyncio.wait_for(self._transport.read(), left)
            except asyncio.TimeoutError:
                output.add(bytes(buffer))
                return None, False
            if not chunk:
                output.add(bytes(buffer))
                return None, True
            buffer += chunk
