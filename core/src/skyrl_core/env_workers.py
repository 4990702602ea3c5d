"""The Ray actor that hosts envs for a generator elsewhere (``generator.env_placement=ray``).

An :class:`EnvWorker` holds up to ``envs_per_worker`` live envs of one class, each under a key the
generator chose, and does only what the env does: ``areset``, ``astep`` and ``afinish`` (metrics, then
close). The token stream and every engine call stay with the generator. An env that makes sub-calls (the
RLM's ``llm_query``/``rlm_query``) gets a handler that does not answer them here: a step returns either
its result or the next sub-call, ``("call", id, method, params)``, and the generator answers it with
:meth:`EnvWorker.answer`, which resumes the step. The worker sweeps its node's orphans when it starts.
"""

from __future__ import annotations

import asyncio
import itertools
import os
from typing import Any

from skyrl_core.env import StepResult, TextEnv

#: What :meth:`EnvWorker.step` and :meth:`EnvWorker.answer` return: ``("step", StepResult)`` once the
#: step is done, or ``("call", call_id, method, params)`` for a sub-call the generator must answer.
Event = tuple[Any, ...]


class HostedEnv:
    """One env in a worker: its running step and the sub-calls that step is waiting on."""

    def __init__(self, env: TextEnv) -> None:
        self.env = env
        self.calls: asyncio.Queue[Event] = asyncio.Queue()
        self.pending: dict[int, asyncio.Future[Any]] = {}
        self.ids = itertools.count()
        self.step: asyncio.Task[StepResult] | None = None

    async def forward_subcall(self, method: str, params: dict[str, Any]) -> Any:
        """The env's sub-call handler: queue the call for the generator and wait for its answer."""
        call_id = next(self.ids)
        answer = self.pending[call_id] = asyncio.get_running_loop().create_future()
        self.calls.put_nowait(("call", call_id, method, params))
        try:
            return await answer
        finally:
            self.pending.pop(call_id, None)

    async def next_event(self) -> Event:
        """The step's next sub-call, or its result once it is done."""
        assert self.step is not None
        call = asyncio.ensure_future(self.calls.get())
        done, _ = await asyncio.wait({self.step, call}, return_when=asyncio.FIRST_COMPLETED)
        if call in done:
            return call.result()
        call.cancel()
        return ("step", self.step.result())


class EnvWorker:
    """Hosts envs of ``env_cls`` built with ``env_config`` (run as a Ray actor; plain object in tests)."""

    def __init__(self, env_cls: type[TextEnv], env_config: Any) -> None:
        from skyrl_core.nodes import sweep_orphans

        self.env_cls, self.env_config = env_cls, env_config
        self.envs: dict[str, HostedEnv] = {}
        self.swept = sweep_orphans()  # what workers that died on this node left behind

    def describe(self) -> dict[str, Any]:
        """Where this worker runs: Ray node id, pid, and what its start-up sweep removed."""
        return {"node_id": _node_id(), "pid": os.getpid(), "swept": self.swept}

    async def reset(self, key: str, task: dict[str, Any], seed: int | None,
                    subcalls: bool) -> tuple[list[dict[str, str]], dict[str, Any]]:
        env = self.env_cls(task=task, config=self.env_config)
        hosted = self.envs[key] = HostedEnv(env)
        if subcalls:
            env.subcall_handler = hosted.forward_subcall  # type: ignore[attr-defined]
        return await env.areset(seed=seed, options={"task": task})

    async def step(self, key: str, action: str) -> Event:
        hosted = self.envs[key]
        hosted.step = asyncio.ensure_future(hosted.env.astep(action))
        return await hosted.next_event()

    async def answer(self, key: str, call_id: int, value: Any, error: BaseException | None = None) -> Event:
        """Resume the step with the generator's answer to sub-call ``call_id``; ``error`` (what the generator's
        handler raised) is raised inside the env instead, as a local env would see it."""
        hosted = self.envs[key]
        waiting = hosted.pending.get(call_id)
        if waiting is not None and not waiting.done():
            if error is None:
                waiting.set_result(value)
            else:
                waiting.set_exception(error)
        return await hosted.next_event()

    async def finish(self, key: str) -> dict[str, float]:
        """The env's metrics, then close it; the key is free afterwards."""
        hosted = self.envs.pop(key, None)
        if hosted is None:
            return {}
        if hosted.step is not None and not hosted.step.done():  # the generator gave up on it (a failed sub-call)
            hosted.step.cancel()
        return await hosted.env.afinish()

    def live(self) -> int:
        return len(self.envs)


def _node_id() -> str | None:
    try:
        import ray

        return ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
    except Exception:  # noqa: BLE001 - outside Ray (tests): no node
        return None


def sweep_node() -> dict[str, Any]:
    """Body of the sweep task placed on every live node after a worker was lost."""
    from skyrl_core.nodes import sweep_orphans

    return {"node_id": _node_id(), "swept": sweep_orphans()}
