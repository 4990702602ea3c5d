"""``openenv``: an OpenEnv environment as a SkyRL TextEnv.

The reset observation (rendered, plus which action fields to give) is the prompt. Each reply is parsed into the
env's typed Action (see :mod:`skyrl_bridge_openenv.actions`); a reply that makes no valid action is never sent to
the env: the model is told which fields are expected and the turn scores 0 (the bottom of the range on the last
turn, the base rule for rejected replies), counted in the ``invalid_actions`` metric. OpenEnv has no notion of an
invalid step to defer to. Each observation's reward is the turn's reward (None is 0); the episode's reward is
their sum. ``done`` ends the episode (terminated); ``env.max_turns`` truncates it.

Per task: a row's ``seed`` is the env's reset seed (so every sample of a row plays the same episode); a row
without one uses the reset seed. In process, the global ``random``/``numpy.random`` states are restored after
every call into the env. The episode's reward range is ``env.reward_range`` when set, else the Environment class's
``reward_range`` attribute when it has one, else [0, 1]. Gold actions: the Environment's optional
``gold_actions()`` method (mode 'inprocess' only; a server cannot be asked).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from skyrl_core import StepResult, TextEnv

from skyrl_bridge_openenv.actions import ActionCodec, action_model_from_schema, render
from skyrl_bridge_openenv.catalog import Target, resolve
from skyrl_bridge_openenv.config import OpenEnvConfig
from skyrl_bridge_openenv.runtime import ActionRefused, InProcess, Remote, ServerProcess, fetch_schema

TEST_SEED_BASE = 1_000_000


class OpenEnvEnv(TextEnv):
    config_class = OpenEnvConfig
    config: OpenEnvConfig
    reward_range = (0.0, 1.0)

    @classmethod
    def reward_range_for(cls, config: OpenEnvConfig) -> tuple[float, float]:  # type: ignore[override]
        if config.reward_range is not None:
            return tuple(config.reward_range)  # type: ignore[return-value]
        target = resolve(config.name, config.action, remote_ok=config.mode == "url")
        declared = target.declared_range() if target is not None else None
        return declared or tuple(cls.reward_range)  # type: ignore[return-value]

    @classmethod
    def load_dataset(cls, split: str = "train", config: OpenEnvConfig | None = None) -> Sequence[dict[str, Any]]:
        config = config or OpenEnvConfig()
        count, base = (config.test_tasks, TEST_SEED_BASE) if split == "test" else (config.train_tasks, 0)
        return [{"name": f"{config.name}#seed{base + i}", "seed": base + i} for i in range(count)]

    def __init__(self, task: Mapping[str, Any] | None = None,
                 config: OpenEnvConfig | Mapping[str, Any] | None = None) -> None:
        super().__init__(task, config)
        self._runtime: InProcess | Remote | None = None
        self._target: Target | None = None
        self._codec: ActionCodec | None = None
        self._reset_seed: int | None = None
        self._new_episode()

    def __getstate__(self) -> dict[str, Any]:  # a pickled env (remote workers) starts with no runtime
        state = dict(self.__dict__)
        state.update(_runtime=None, _target=None, _codec=None)
        return state

    def _new_episode(self) -> None:
        self.invalid_actions = 0
        self.peer_done = False

    # -- the peer ----------------------------------------------------------------------------------

    def _prepare(self) -> tuple[InProcess | Remote, ActionCodec]:
        if self._runtime is not None and self._codec is not None:
            return self._runtime, self._codec
        c = self.config
        target = resolve(c.name, c.action, remote_ok=c.mode == "url")
        if target is None:  # mode 'url', an env not importable here: the server's schema says the fields
            target = Target(c.name, None, action_model_from_schema(fetch_schema(c.url or "", c.timeout_s)), None)
        self._target, self._codec = target, ActionCodec(target.action_cls)
        if c.mode == "inprocess":
            self._runtime = InProcess(target.env_cls, c.args)  # type: ignore[arg-type]
        elif c.mode == "server":
            server = ServerProcess(target.env_path, target.action_path, target.observation_path, c.args,
                                   c.server_start_timeout_s)
            self._runtime = Remote(server.url, c.timeout_s, server)
        else:
            if c.args:
                raise ValueError("env.args cannot reach a server at env.url: it built its env already; "
                                 "pass them where that server starts")
            self._runtime = Remote(c.url or "", c.timeout_s)
        return self._runtime, self._codec

    def _peer_seed(self) -> int:
        seed = self.task.get("seed")
        if isinstance(seed, int) and not isinstance(seed, bool):
            return seed % 2**31
        if self._reset_seed is not None:
            return self._reset_seed % 2**31
        return int(self.np_random.integers(2**31))

    def _prompt(self, observation: dict[str, Any], codec: ActionCodec) -> list[dict[str, str]]:
        text = render(observation, self.config.render)
        if self.config.instructions:
            text = f"{text}\n\n{codec.instructions()}"
        return [{"role": "user", "content": text}]

    # -- the TextEnv contract ----------------------------------------------------------------------

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        self._new_episode()
        self._reset_seed = seed
        return super().reset(seed=seed, options=options)

    async def areset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        self._new_episode()
        self._reset_seed = seed
        return await super().areset(seed=seed, options=options)

    def build_prompt(self) -> list[dict[str, str]]:
        runtime, codec = self._prepare()
        return self._prompt(runtime.reset(self._peer_seed()).observation, codec)

    async def abuild_prompt(self) -> list[dict[str, str]]:
        runtime, codec = self._prepare()
        return self._prompt((await runtime.areset(self._peer_seed())).observation, codec)

    def take_action(self, action: str) -> StepResult:
        runtime, codec = self._prepare()
        parsed, problem = codec.parse(action)
        if parsed is None:
            return self._invalid(problem or "invalid action")
        try:
            reply = runtime.step(parsed)
        except ActionRefused as exc:
            return self._invalid(codec.expected(f"the environment refused it: {exc}"))
        return self._result(reply)

    async def atake_action(self, action: str) -> StepResult:
        runtime, codec = self._prepare()
        parsed, problem = codec.parse(action)
        if parsed is None:
            return self._invalid(problem or "invalid action")
        try:
            reply = await runtime.astep(parsed)
        except ActionRefused as exc:
            return self._invalid(codec.expected(f"the environment refused it: {exc}"))
        return self._result(reply)

    def _invalid(self, problem: str) -> StepResult:
        return self.reject_action(problem)

    def reject_action(self, problem: str) -> StepResult:
        self.invalid_actions += 1
        return super().reject_action(problem)

    def _result(self, reply: Any) -> StepResult:
        reward = 0.0 if reply.reward is None else float(reply.reward)
        if not math.isfinite(reward):
            raise ValueError(f"OpenEnv env {self.config.name!r} returned a non-finite reward {reply.reward!r}")
        self.peer_done = reply.done
        text = render(reply.observation, self.config.render)
        return StepResult([{"role": "user", "content": text}], reward, reply.done, False, {})

    def gold_actions(self) -> list[str] | None:
        if not isinstance(self._runtime, InProcess) or self._codec is None:
            return None
        actions = self._runtime.call("gold_actions")
        return None if actions is None else [self._codec.to_text(action) for action in actions]

    def get_metrics(self) -> dict[str, float]:
        return {"invalid_actions": float(self.invalid_actions), "peer_done": float(self.peer_done)}

    def close(self) -> None:
        runtime, self._runtime = self._runtime, None
        self._codec = None
        if runtime is not None:
            runtime.close()
        super().close()
