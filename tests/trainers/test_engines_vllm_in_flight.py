"""In-flight weight updates of the ``vllm`` engine, on CPU: our pause / load / resume orchestration and the
per-token versions, against a stand-in for vLLM's ``AsyncLLM`` (vLLM itself needs a CUDA GPU; the GPU test
in test_engines_vllm.py and ``bench/gpu_smoke.py --mode async`` run the real one where a GPU is lent).

The stand-in keeps vLLM's contract as its docs state it: one token per running request per engine step,
outputs streamed as deltas, ``pause_generation(mode="wait")`` stops admitting and returns once the
requests in flight are done, ``mode="keep"`` freezes them between two steps, ``resume_generation``
lets everything go on, and ``reset_prefix_cache(reset_running_requests=True)`` preempts the running
requests so that they are recomputed. Each token is ``1000 * weights + position`` and its logprob
``-1 - weights``, so a test can read which weights produced it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from skyrl_core.engine import SamplingParams
from skyrl_trainers.engines.vllm import VLLMEngine, VLLMEngineConfig, VLLMUnavailableError


@dataclass
class _Logprob:
    logprob: float


@dataclass
class _Delta:
    token_ids: list[int]
    logprobs: list[dict[int, _Logprob]]
    text: str
    finish_reason: str | None


@dataclass
class _Output:
    outputs: list[_Delta]


class SteppedLLM:
    """The parts of ``vllm.v1.engine.async_llm.AsyncLLM`` the engine calls, with a scheduler that steps."""

    def __init__(self, step_seconds: float = 0.002) -> None:
        self.step_seconds = step_seconds
        self.weights = 0
        self.state = "running"  # or the pause mode: "wait" admits nothing new, "keep" also parks requests
        self.active = self.parked = self.recomputed = 0
        self.tokens_sent = 0
        self.pauses: list[str] = []
        self.loaded_while: list[str] = []
        self._cond: asyncio.Condition | None = None  # made on the engine's loop

    @property
    def cond(self) -> asyncio.Condition:
        if self._cond is None:
            self._cond = asyncio.Condition()
        return self._cond

    async def generate(self, prompt: Any, sampling: Any, request_id: str):
        async with self.cond:
            await self.cond.wait_for(lambda: self.state == "running")
            self.active += 1
        try:
            for position in range(sampling.max_tokens):
                await asyncio.sleep(self.step_seconds)
                async with self.cond:
                    if self.state == "keep":
                        self.parked += 1
                        self.cond.notify_all()
                        await self.cond.wait_for(lambda: self.state == "running")
                        self.parked -= 1
                token = 1000 * self.weights + position
                self.tokens_sent += 1
                last = position == sampling.max_tokens - 1
                yield _Output([_Delta([token], [{token: _Logprob(-1.0 - self.weights)}], f"<{token}>",
                                      "length" if last else None)])
        finally:
            async with self.cond:
                self.active -= 1
                self.cond.notify_all()

    async def pause_generation(self, *, mode: str = "abort", clear_cache: bool = True) -> None:
        async with self.cond:
            self.pauses.append(mode)
            self.state = mode
            self.cond.notify_all()
            if mode == "wait":
                await self.cond.wait_for(lambda: self.active == 0)
            else:
                await self.cond.wait_for(lambda: self.parked == self.active)

    async def resume_generation(self) -> None:
        async with self.cond:
            self.state = "running"
            self.cond.notify_all()

    async def collective_rpc(self, method: str, timeout: float | None = None, args: tuple = (),
                             kwargs: dict | None = None) -> list[int]:
        assert method == "skyrl_load_weights"
        self.loaded_while.append(self.state)
        (chunk,) = args
        self.weights = int(dict(chunk)["tag"].item())
        return [len(chunk)]

    async def reset_prefix_cache(self, reset_running_requests: bool = False, reset_connector: bool = False) -> bool:
        if reset_running_requests:
            self.recomputed += self.active
            return True
        return self.active == 0

    def shutdown(self) -> None:
        pass


class OldLLM(SteppedLLM):
    """A vLLM from before pause modes: ``pause_generation`` takes no ``mode``."""

    async def pause_generation(self, *, wait_for_inflight_requests: bool = False, clear_cache: bool = True) -> None:
        raise AssertionError("the engine must not pause a vLLM without pause modes")


class StandInEngine(VLLMEngine):
    """The real engine, building plain request objects instead of vLLM's (whose classes need vllm installed)."""

    def _prompt(self, prompt_ids: list[int]) -> Any:
        return {"prompt_token_ids": prompt_ids}

    def _sampling(self, params: SamplingParams) -> Any:
        return params


def make_engine(mode: str, llm: SteppedLLM | None = None) -> tuple[VLLMEngine, SteppedLLM]:
    llm = llm or SteppedLLM()
    return StandInEngine(VLLMEngineConfig(model="tiny-random", in_flight_updates=mode), llm=llm), llm


def run_with_update(engine: VLLMEngine, llm: SteppedLLM, after_tokens: int, max_tokens: int = 12):
    """Generate ``max_tokens`` while an update to weights 1 is sent once ``after_tokens`` are out."""

    async def scenario():
        request = asyncio.ensure_future(engine.generate([1, 2, 3], SamplingParams(max_tokens=max_tokens)))
        while llm.tokens_sent < after_tokens:
            await asyncio.sleep(0.001)
        await engine.update_weights({"tag": torch.tensor(1)})
        return await request

    return asyncio.run(scenario())


def produced_by(out) -> list[int]:
    return [token // 1000 for token in out.token_ids]


@pytest.mark.parametrize("mode", ["keep", "recompute"])
def test_an_update_lands_mid_request_and_each_token_carries_the_weights_that_produced_it(mode):
    engine, llm = make_engine(mode)
    try:
        out = run_with_update(engine, llm, after_tokens=3)
    finally:
        engine.close()
    assert len(out.token_ids) == 12 and out.stop_reason == "length"
    assert out.weight_versions == produced_by(out)  # the versions say which weights sampled each token
    switch = out.weight_versions.index(1)
    assert 3 <= switch < 12 and out.weight_versions == [0] * switch + [1] * (12 - switch)
    assert out.logprobs == [-1.0 - v for v in out.weight_versions]
    assert out.metadata["weight_version"] == 0 and engine.weight_version == 1
    assert llm.pauses == ["keep"] and llm.loaded_while == ["keep"] and llm.state == "running"
    assert llm.recomputed == (1 if mode == "recompute" else 0)
    assert out.text == "".join(f"<{t}>" for t in out.token_ids)


def test_off_lets_the_requests_in_flight_finish_first_and_holds_new_ones_until_the_weights_are_in():
    engine, llm = make_engine("off")
    try:
        async def scenario():
            params = SamplingParams(max_tokens=10)
            first = asyncio.ensure_future(engine.generate([1], params))
            while llm.tokens_sent < 2:
                await asyncio.sleep(0.001)
            update = asyncio.ensure_future(engine.update_weights({"tag": torch.tensor(1)}))
            while not llm.pauses:
                await asyncio.sleep(0.001)
            second = asyncio.ensure_future(engine.generate([2], params))  # arrives during the pause
            return await first, await second, await update

        first, second, _ = asyncio.run(scenario())
    finally:
        engine.close()
    assert produced_by(first) == first.weight_versions == [0] * 10  # no completion mixes versions
    assert produced_by(second) == second.weight_versions == [1] * 10
    assert second.metadata["weight_version"] in (0, 1)  # admitted while the update ran
    assert llm.pauses == ["wait"] and llm.loaded_while == ["wait"]


def test_keep_or_recompute_on_a_vllm_without_pause_modes_is_refused_with_the_fix():
    with pytest.raises(VLLMUnavailableError, match="pause_generation takes mode=.*in_flight_updates=off"):
        make_engine("keep", OldLLM())


def test_off_on_a_vllm_without_pause_modes_updates_between_engine_steps_as_before():
    engine, llm = make_engine("off", OldLLM())
    try:
        asyncio.run(engine.update_weights({"tag": torch.tensor(1)}))
        out = asyncio.run(engine.generate([1], SamplingParams(max_tokens=3)))
    finally:
        engine.close()
    assert llm.loaded_while == ["running"] and produced_by(out) == out.weight_versions == [1, 1, 1]


def test_off_sync_runs_set_the_vllm_engine_to_keep_unless_the_user_chose():
    from skyrl_trainers.engine_setup import engine_config_for_policy

    def chosen(mode, **engine):
        config = SimpleNamespace(engine=VLLMEngineConfig(**engine),
                                 trainer=SimpleNamespace(model="tiny-random", mode=mode, precision="auto"))
        return engine_config_for_policy(config).in_flight_updates

    assert chosen("sync") == "off"
    assert chosen("async") == chosen("one_step_off") == "keep"
    assert chosen("async", in_flight_updates="recompute") == "recompute"
