"""The verifiers side of the bridge: loading a peer env offline, its rows, its reward range, and one episode
in which the peer's own loop (``Env.run``) drives the policy's seat turn by turn.

verifiers 0.4.0 (``verifiers.v1``) runs an episode as ``Env.run(task, agents)``: a plain taskset gets
``SingleAgentEnv`` (one ``agents.agent.run(task)``), a multi-turn env holds ``agents.<seat>.interaction(task)``
open and calls ``interaction.turn(...)`` for each reply. The bridge hands the env agents of its own: the policy's
seat posts each prompt to the bridge and waits for the policy's action instead of calling a model through a
harness program; the trace it builds is scored by the task's own ``Task.score`` (its ``@vf.reward`` functions,
summed with their weights as ``Trace.reward`` sums them). Everything peer-side runs on ONE process-wide
background event loop, so an episode's coroutine survives from ``reset`` through every ``step``.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import itertools
import json
import os
import threading
from collections.abc import Iterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

_PEERS: dict[tuple[str, str], Peer] = {}
_PEERS_LOCK = threading.Lock()


class VerifiersDataError(RuntimeError):
    """A peer env needs data (a dataset download, an nltk corpus) that is not on this machine."""


# -- offline guards ------------------------------------------------------------------------------------------


@contextlib.contextmanager
def offline(name: str) -> Iterator[None]:
    """Hub libraries read their offline switches; nltk.download fails at once for a corpus not installed."""
    saved = {key: os.environ.get(key) for key in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE")}
    os.environ.update({"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"})
    nltk = None
    original = None
    try:
        import nltk  # noqa: F401 - only patched where the peer uses it
    except ImportError:
        nltk = None
    if nltk is not None:
        original = nltk.download

        def download(info_or_id: Any = None, *args: Any, **kwargs: Any) -> bool:
            resource = str(info_or_id)
            for kind in ("corpora", "taggers", "tokenizers", "models", ""):
                with contextlib.suppress(LookupError):
                    nltk.data.find(f"{kind}/{resource}" if kind else resource)
                    return True
                with contextlib.suppress(LookupError):
                    nltk.data.find(f"{kind}/{resource}.zip" if kind else f"{resource}.zip")
                    return True
            raise VerifiersDataError(
                f"verifiers env {name!r} needs the nltk resource {resource!r}, which is not installed, and nothing "
                f"is downloaded at run time: install it beforehand (python -m nltk.downloader {resource}) or "
                f"give local rows with env.data_files")

        nltk.download = download
    try:
        yield
    finally:
        if nltk is not None:
            nltk.download = original
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


# -- loading -------------------------------------------------------------------------------------------------


class Peer:
    """A loaded verifiers env: its ``Env`` (``None`` for a bare taskset), taskset, task class and reward range."""

    def __init__(self, name: str, env: Any, taskset: Any) -> None:
        from verifiers.v1.envs.single_agent import SingleAgentEnv

        self.name = name
        self.env = env
        self.taskset = taskset
        self.task_cls = type(taskset).task_type()
        self.seats: list[str] = list(getattr(env, "_agent_specs", {}) or {"agent": None})
        self.single_turn = env is None or type(env).run is SingleAgentEnv.run
        self.weights = reward_weights(self.task_cls, taskset.config.task)
        low = sum(w for w in self.weights.values() if w < 0)
        high = sum(w for w in self.weights.values() if w > 0)
        # An env that records its own rewards in run()/finalize() declares none on the task: [0, 1] by default.
        self.reward_range: tuple[float, float] = (float(low), float(high)) if high > low else (0.0, 1.0)

    def task(self, data: Mapping[str, Any]) -> Any:
        return self.task_cls(self.task_cls.data_type().model_validate(dict(data)), self.taskset.config.task)


def reward_weights(task_cls: type, task_config: Any) -> dict[str, float]:
    """The weight of each reward the task sums: its ``@vf.reward`` methods, the config-plugged rewards and judges."""
    probe = task_cls.__new__(task_cls)  # hooks() reads only the class's decorated methods and the config
    probe.config = task_config
    weights = {fn.__name__: float(getattr(fn, "_vf_weight", 1.0)) for fn in probe.hooks("reward")}
    for judge in getattr(task_config, "judges", []) or []:
        weights[f"judge:{getattr(judge, 'id', '?')}"] = float(getattr(judge, "weight", 1.0))
    return weights


def load_peer(name: str, args: Mapping[str, Any]) -> Peer:
    """The verifiers env ``name`` names (cached per name and args), built offline."""
    key = (name, json.dumps(dict(args), sort_keys=True, default=str))
    with _PEERS_LOCK:
        if key not in _PEERS:
            _PEERS[key] = _build_peer(name, dict(args))
        return _PEERS[key]


def _build_peer(name: str, args: dict[str, Any]) -> Peer:
    import verifiers.v1 as vf

    with offline(name):
        if ":" in name:
            module_name, _, attr = name.partition(":")
            try:
                module = importlib.import_module(module_name)
            except ModuleNotFoundError as exc:
                raise ValueError(f"env.name {name!r}: cannot import module {module_name!r} ({exc})") from exc
            factory = getattr(module, attr, None)
            if not callable(factory):
                raise ValueError(f"env.name {name!r}: {module_name} has no function {attr!r}")
            made = factory(**args)
            if isinstance(made, vf.Env):
                return Peer(name, made, made.taskset)
            if isinstance(made, vf.Taskset):
                return Peer(name, None, made)
            raise TypeError(f"env.name {name!r} returned {type(made).__name__}; expected a verifiers.v1 Env or "
                            "Taskset")
        try:
            config = vf.resolve_env_config({"taskset": {"id": name, **args}})
            env = vf.load_environment(config)
        except ModuleNotFoundError as exc:
            raise ValueError(f"no verifiers taskset {name!r} is installed ({exc}); `skyrl envs --catalog "
                             f"verifiers` lists the installed ones, or name a module:function") from exc
        return Peer(name, env, env.taskset)


def peer_rows(peer: Peer, name: str, data_files: str | None, max_rows: int) -> list[dict[str, Any]]:
    """Task rows: ``data_files`` (JSONL of the taskset's TaskData fields), else the taskset's own ``load()``."""
    data_type = peer.task_cls.data_type()
    if data_files:
        rows = []
        path = Path(data_files)
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                data = data_type.model_validate(record)
            except Exception as exc:  # noqa: BLE001 - one clear message naming the line
                raise ValueError(f"{path}:{number}: not a {data_type.__name__} row ({exc})") from exc
            rows.append(_row(data.model_copy(update={"idx": len(rows)}), name))
            if len(rows) >= max_rows:
                break
        return rows
    try:
        with offline(name):
            tasks = list(itertools.islice(iter(peer.taskset), max_rows))
    except VerifiersDataError:
        raise
    except Exception as exc:  # noqa: BLE001 - a download attempt, a missing file: one clear error
        raise VerifiersDataError(
            f"verifiers env {name!r} could not load its tasks offline ({type(exc).__name__}: {exc}). Nothing is "
            f"downloaded at run time: give local rows with env.data_files=FILE.jsonl (one JSON object a line with "
            f"the fields of {data_type.__name__}: {', '.join(sorted(data_type.model_fields))})") from exc
    return [_row(task.data, name) for task in tasks]


def _row(data: Any, name: str) -> dict[str, Any]:
    return {"name": data.name or f"{name}#{data.idx}", "id": data.id, "index": data.idx,
            "data": data.model_dump(mode="json", exclude_defaults=True)}


# -- one episode -------------------------------------------------------------------------------------------


def _as_dict(message: Any) -> dict[str, str]:
    from verifiers.v1.types import content_text

    return {"role": str(message.role), "content": content_text(message.content) or ""}


class SeatUnavailable(RuntimeError):
    """A seat the bridge does not play would need a model of its own."""


class PeerEpisode:
    """One episode of ``peer`` on ``task``; its coroutines run on :func:`loop`.

    Events from the peer's loop: ``("ask", messages)`` (the policy's turn; the NEW messages since its last
    reply), ``("end", reward, info)`` (the peer's loop finished and scored the policy's trace) or
    ``("error", exception)``.
    """

    def __init__(self, peer: Peer, task: Any, *, seat: str | None, max_turns: int) -> None:
        if seat is not None and seat not in peer.seats:
            raise ValueError(f"env.seat {seat!r}: {peer.name} has the seats {peer.seats}")
        self.peer = peer
        self.task = task
        self.seat = seat or peer.seats[0]
        self.max_turns = max_turns
        self.turns = 0
        self.traces: list[Any] = []
        self.trace: Any = None
        self.result: dict[str, Any] = {}
        self._events: asyncio.Queue | None = None
        self._reply: asyncio.Future | None = None
        self._runner: asyncio.Task | None = None

    # called on the background loop
    async def start(self) -> tuple:
        self._events = asyncio.Queue()
        self._runner = asyncio.get_running_loop().create_task(self._run())
        return await self._events.get()

    async def act(self, text: str) -> tuple:
        if self._reply is None or self._reply.done():
            raise RuntimeError("the peer's loop is not waiting for a reply")
        self._reply.set_result(text)
        return await self._events.get()

    async def cancel(self) -> None:
        if self._runner is not None and not self._runner.done():
            self._runner.cancel()
            with contextlib.suppress(BaseException):
                await self._runner

    async def _run(self) -> None:
        import verifiers.v1 as vf
        from verifiers.v1.episode import EnvInfo, Episode
        from verifiers.v1.trace import TraceTask

        try:
            if self.peer.env is None:
                await _PolicySeat(self, "agent").run(self.task)
            else:
                env = self.peer.env
                agents = vf.Agents(env.config, self._make_agent)
                await env.setup(agents)
                await env.run(self.task, agents)
                episode = Episode(env=EnvInfo(id=env.config.env_id),
                                  task=TraceTask(type=type(self.task).__name__, data=self.task.data,
                                                 key=self.task.key, hash=self.task.hash),
                                  traces=list(self.traces))
                await env.finalize(self.task, episode)
            if self.trace is None:
                raise RuntimeError(f"{self.peer.name}: the env's run() never ran the seat {self.seat!r}")
            rewards = {k: r.score for k, r in self.trace.rewards.items() if r is not None}
            self.result = {"rewards": rewards, "metrics": {k: v for k, v in self.trace.metrics.items()
                                                           if v is not None},
                           "stop": self.trace.stop_condition}
            await self._events.put(("end", float(self.trace.reward), dict(self.result)))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - handed to the bridge, which reports it
            await self._events.put(("error", exc))

    def _make_agent(self, name: str, spec: Any) -> Any:
        return _PolicySeat(self, name) if name == self.seat else _OtherSeat(name, self.seat)

    def new_trace(self, task: Any, name: str) -> Any:
        import verifiers.v1 as vf
        from verifiers.v1.trace import AgentInfo, Trace, TraceTask

        trace = Trace(task=TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
                      agent=AgentInfo(config=vf.AgentConfig(), name=name))
        self.trace = trace
        return trace

    async def ask(self, trace: Any, messages: list[Any]) -> str | None:
        """Add ``messages`` to the trace and wait for the policy's reply; ``None`` past the turn limit."""
        from verifiers.v1.graph import MessageNode
        from verifiers.v1.types import AssistantMessage

        if self.turns >= self.max_turns:
            return None
        for message in messages:
            trace.nodes.append(MessageNode(parent=len(trace.nodes) - 1 if trace.nodes else None, message=message))
        self.turns += 1
        self._reply = asyncio.get_running_loop().create_future()
        await self._events.put(("ask", [_as_dict(m) for m in messages]))
        text = await self._reply
        trace.nodes.append(MessageNode(parent=len(trace.nodes) - 1 if trace.nodes else None,
                                       message=AssistantMessage(content=text), sampled=True))
        return text

    async def finish(self, task: Any, trace: Any) -> None:
        if trace.stop_condition is None:
            trace.stop("agent_completed")
        trace.is_completed = True
        trace.ok = True
        await task.score(trace)
        self.traces.append(trace)


def opening(task: Any) -> list[Any]:
    """The task's opening messages as a chat harness sends them: its system prompt, then its prompt."""
    from verifiers.v1.dialects import parse_message
    from verifiers.v1.types import SystemMessage, UserMessage

    messages: list[Any] = []
    if task.data.system_prompt:
        messages.append(SystemMessage(content=task.data.system_prompt))
    prompt = task.data.prompt
    if isinstance(prompt, str):
        messages.append(UserMessage(content=prompt))
    elif prompt:
        messages.extend(parse_message(m) if isinstance(m, dict) else m for m in prompt)
    return messages


class _PolicySeat:
    """The seat the policy plays: ``run`` is one reply, ``interaction`` one reply per ``turn``."""

    def __init__(self, episode: PeerEpisode, name: str) -> None:
        self.episode = episode
        self.name = name
        self.trainable = True

    async def run(self, task: Any, **_: Any) -> Any:
        trace = self.episode.new_trace(task, self.name)
        reply = await self.episode.ask(trace, opening(task))
        if reply is None:
            trace.stop("max_turns")
        await self.episode.finish(task, trace)
        return trace

    @asynccontextmanager
    async def interaction(self, task: Any, **_: Any):
        trace = self.episode.new_trace(task, self.name)
        exchange = _Interaction(self.episode, task, trace)
        try:
            yield exchange
        finally:
            if trace.stop_condition is None:
                trace.stop("user_closed")
            await self.episode.finish(task, trace)


class _Interaction:
    def __init__(self, episode: PeerEpisode, task: Any, trace: Any) -> None:
        self.episode = episode
        self.task = task
        self.trace = trace
        self._started = False
        self._over = False

    async def turn(self, message: Any = None) -> Any:
        from verifiers.v1.agent import Segment
        from verifiers.v1.dialects import parse_message
        from verifiers.v1.types import AssistantMessage, UserMessage

        if self._over:
            raise RuntimeError("the exchange is over (the run ended); read interaction.trace")
        prompted = not self._started and self.task.data.prompt is not None
        if message is None and not prompted:
            raise ValueError("nothing to run a turn on: this exchange takes its next user message")
        if message is not None and prompted:
            raise ValueError("the task's prompt opens this exchange: take its first reply with a bare turn()")
        new: list[Any] = []
        if not self._started:
            new = opening(self.task) if prompted else [m for m in opening(self.task) if m.role == "system"]
        if isinstance(message, str):
            new.append(UserMessage(content=message))
        elif message is not None:
            new.extend(parse_message(m) if isinstance(m, dict) else m for m in message)
        self._started = True
        reply = await self.episode.ask(self.trace, new)
        if reply is None:
            self._over = True
            self.trace.stop("max_turns")
            return Segment(messages=[], terminated=True)
        return Segment(messages=[AssistantMessage(content=reply)])

    async def send(self, *_: Any, **__: Any) -> dict:
        raise NotImplementedError("the skyrl bridge does not steer a running turn; use interaction.turn()")

    steer = send


class _OtherSeat:
    """A seat the policy does not play: it would need a model of its own, which the bridge does not call."""

    def __init__(self, name: str, policy_seat: str) -> None:
        self.name = name
        self.policy_seat = policy_seat
        self.trainable = False

    def _refuse(self) -> SeatUnavailable:
        return SeatUnavailable(f"the env's seat {self.name!r} needs a model of its own; the skyrl bridge plays only "
                               f"the policy's seat {self.policy_seat!r} (env.seat) and calls no other model")

    async def run(self, *_: Any, **__: Any) -> Any:
        raise self._refuse()

    @asynccontextmanager
    async def interaction(self, *_: Any, **__: Any):
        raise self._refuse()
        yield  # pragma: no cover


async def score_reply(peer: Peer, task: Any, reply: str) -> float:
    """The task's own reward for ``reply`` as the single answer to its opening prompt (the gold's ceiling)."""
    episode = PeerEpisode(peer, task, seat=None, max_turns=1)
    trace = episode.new_trace(task, "agent")
    from verifiers.v1.graph import MessageNode
    from verifiers.v1.types import AssistantMessage

    for message in [*opening(task), AssistantMessage(content=reply)]:
        trace.nodes.append(MessageNode(parent=len(trace.nodes) - 1 if trace.nodes else None, message=message,
                                       sampled=isinstance(message, AssistantMessage)))
    await episode.finish(task, trace)
    return float(trace.reward)
