"""``harbor_terminal``: a Harbor task as a TextEnv: shell commands in the task's machine, its tests as reward.

An episode: the prompt is the step's instruction and the action format (see :mod:`.actions`). The
machine starts with the first action: the task image built once per process (on a backend that
runs images), or its Dockerfile replayed on the host's tools (on one that does not). Each command
block runs in one persistent shell as the agent user; the observation is its output (head and tail
past ``max_output_bytes``, with a note) and exit status, or that it was interrupted at
``command_timeout_s``. ``<done/>``, the turn limit or the agent's time (the total time its commands
ran, so a slow model cannot time a task out) end the step; then the step's tests run (:mod:`.verifier`) and give its reward. A multi-step
task then goes on with the next step's instruction in the same machine (unless a ``min_reward``
stops it), and the episode's reward combines the steps' (``multi_step_reward_strategy``): it is
paid on the last turn, every other turn's reward is 0. The machine is removed when the episode
ends, whatever happened. Before a step's turns its ``workdir/`` files are copied in
(:mod:`.step_workdir`), its ``setup.sh`` runs and its healthcheck must pass (:mod:`.healthcheck`);
after them, and before its tests, the task's artifacts are copied out (:mod:`.artifacts`). Each
key of the reward files is kept (``info["rewards"]``, metrics ``reward/<key>``, :mod:`.rewards`).

An environment that cannot be built or started ends that episode with ``info["error"]`` (dropped
from training); other episodes go on. Once the agent has run a command, whatever breaks (the shell
will not start again, the work directory is unusable, the container stopped, a process survived
the kill before the tests) may be the agent's doing, and an error would let a policy escape a bad
reward: the episode is scored instead (the step's tests where they can still run, else 0), with
``info["agent_failure"]`` saying what broke, and counted in the ``agent_failures`` metric.
"""

from __future__ import annotations

import logging
import shlex
import warnings
from collections.abc import Sequence
from functools import cache, lru_cache
from pathlib import Path
from typing import Any, ClassVar

from skyrl_core import StepResult, TextEnv
from skyrl_sandbox.backends.docker import images
from skyrl_sandbox.choice import strong_names
from skyrl_sandbox.loop import run_on_sandbox_loop, run_on_sandbox_loop_sync
from skyrl_sandbox.machine import Machine
from skyrl_sandbox.node import worker_resources
from skyrl_sandbox.registry import get_backend
from skyrl_sandbox.terminal import CommandResult, TerminalSession

from .actions import parse_action
from .artifacts import ArtifactLog, collect_artifacts, default_artifacts_dir, episode_folder
from .collect_hooks import run_collect_hooks
from .config import HarborTerminalConfig
from .forgeable import refusal, select_rows
from .healthcheck import run_healthcheck
from .lint import lint_task, task_workdir
from .provision import (
    Provisioner,
    Started,
    TaskEnvironmentError,
    container_runtime,
    image_backends,
    image_source,
    provisioner,
)
from .rewards import MAX_KEYS
from .step_workdir import upload_step_workdir
from .task import HarborTask, HarborTaskWarning, Step, combine_rewards, load_task
from .tests_machine import AGENT_ARTIFACTS, build_tests_images, prepare_agent_machine, verify_apart
from .verifier import TESTS_DIR, Verdict, verify

log = logging.getLogger(__name__)

BUILTIN_TASKS = Path(__file__).resolve().parent / "tasks"
CLOSE_TIMEOUT_S = 60.0
STEP_SETUP_DIR = "/logs/.step-setup"
ACTION_FORMAT = """\
You are in a Linux terminal as the user `{user}`, in {workdir}. Reply with shell commands in a ```bash code \
block: they run in one persistent bash shell (cd and variables carry over), and you see their output and exit \
status. A command that runs longer than {timeout:g} s is interrupted. When the task is done, reply with <done/>; \
your work is then checked. You have {turns} replies."""


@lru_cache(maxsize=4096)
def cached_task(path: str) -> HarborTask:
    """The task at ``path``, read once per process. Its warnings were said once per kind when the dataset was
    read (:func:`task_rows`); here they only go to the log."""
    task = load_task(path, quiet=True)
    for warning in task.warnings:
        log.info("task %s: %s", task.name, warning)
    return task


def task_rows(source: str | None) -> list[dict[str, Any]]:
    """One row per task: its folder and name (a Parquet dataset is extracted first)."""
    from .dataset import load_tasks

    tasks = load_tasks(source or BUILTIN_TASKS)
    return [{"task_path": str(task.path), "name": task.name, "steps": len(task.steps)} for task in tasks]


class HarborTerminalEnv(TextEnv):
    config_class: ClassVar[type[HarborTerminalConfig]] = HarborTerminalConfig
    reward_range: ClassVar[tuple[float, float]] = (0.0, 1.0)
    dataset_option: ClassVar[str] = "tasks"
    config: HarborTerminalConfig

    @classmethod
    def ray_resources(cls, config: HarborTerminalConfig) -> dict[str, float]:
        """A slot of the configured backend's nodes (``auto``: of the first strong backend that runs images)."""
        return worker_resources(config.backend, auto=next(iter(_auto_image_backends()), None))

    def __init__(self, task: dict[str, Any] | None = None, config: Any = None) -> None:
        super().__init__(task, config)
        self._machine: Machine | None = None
        self._provisioner: Provisioner | None = None
        self._shell: TerminalSession | None = None
        self._reset_episode()

    # -- dataset ----------------------------------------------------------------------------------

    @classmethod
    def load_dataset(cls, split: str = "train", config: HarborTerminalConfig | None = None) -> Sequence[dict[str, Any]]:
        """Every task of ``config.tasks`` (default: the built-in tasks), for any split; forgeable tasks are left out
        or marked, as ``config.forgeable_tasks`` says (:mod:`.forgeable`)."""
        rows = select_rows(task_rows(config.tasks if config else None), cached_task,
                           config.forgeable_tasks if config else "skip", split)
        if config is not None and config.verifier_cwd != TESTS_DIR:
            warn_where_the_tests_start(rows, config.verifier_cwd)
        return rows

    # -- episodes ---------------------------------------------------------------------------------

    def _reset_episode(self) -> None:
        self.step_index = 0
        self.step_rewards: list[float | None] = []
        self.step_rewards_by_key: list[dict[str, float]] = []  # each step's reward file, key by key
        self.rewards_by_key: dict[str, float] = {}  # the episode's, combined as the steps' rewards are
        self.artifact_log: ArtifactLog | None = None
        self.verdicts: list[Verdict] = []
        self.agent_seconds = 0.0  # the commands' time in this step
        self.total_agent_seconds = 0.0
        self.oracle = False
        self.ended = False
        self.agent_acted = False  # a command of the agent's ran: from then on, failures are scored, not errors
        self.step_ready = False  # the current step's setup ran
        self.counters = {"commands": 0, "command_timeouts": 0, "shell_restarts": 0, "truncated_outputs": 0,
                         "no_command_turns": 0, "refused_blocks": 0, "agent_failures": 0}
        self.timings = {"build_s": 0.0, "start_s": 0.0, "wait_s": 0.0, "verify_s": 0.0}
        self.container_error = False
        self.final_reward: float | None = None
        self.report: dict[str, str] = {}  # info["report"]: where the machine came from (skyrl check --dataset)

    @property
    def harbor_task(self) -> HarborTask:
        path = self.task.get("task_path")
        if not isinstance(path, str) or not path:
            raise ValueError("harbor_terminal: the task row has no 'task_path' (a Harbor task folder)")
        return cached_task(path)

    @property
    def current_step(self) -> Step:
        return self.harbor_task.steps[self.step_index]

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[list[dict[str, str]], dict[str, Any]]:
        self._close_machine()
        self._reset_episode()
        messages, info = super().reset(seed=seed, options=options)
        forgeable = {"forgeable": self.task["forgeable"]} if self.task.get("forgeable") else {}
        return messages, {**info, "task": self.harbor_task.name, "steps": len(self.harbor_task.steps), **forgeable}

    def build_prompt(self) -> list[dict[str, str]]:
        return [{"role": "user", "content": self._step_prompt(self.current_step)}]

    def _step_prompt(self, step: Step) -> str:
        task = self.harbor_task
        workdir = task.environment.workdir or "its working directory"
        user = task.steps[0].agent_user or self.config.agent_user  # the machine's (see provision.Provisioner)
        header = ACTION_FORMAT.format(user=user, workdir=workdir, timeout=self.config.command_timeout_s,
                                      turns=self.config.max_turns)
        if task.multi_step:
            header += f"\n\nThis is step {self.step_index + 1} of {len(task.steps)} ({step.name})."
        return f"{step.instruction.strip()}\n\n{header}"

    def gold_actions(self) -> list[str] | None:
        """The task's oracle: each step's ``solution/solve.sh``, run by the agent user in the shell.

        Calling this arms oracle mode for the episode: the step's solution folder is placed at
        ``/solution`` (read-only to the agent) before the step's first command.
        """
        task = self.harbor_task
        if not all(step.solution_dir is not None for step in task.steps):
            return None
        self.oracle = True
        exports = " ".join(f"{key}={shlex.quote(value)}" for key, value in task.solution_env.items())
        command = f"{exports + ' ' if exports else ''}bash /solution/solve.sh"
        return [f"```bash\n{command}\n```\n<done/>" for _ in task.steps]

    def take_action(self, action: str) -> StepResult:
        return run_on_sandbox_loop_sync(self.atake_action(action))

    async def atake_action(self, action: str) -> StepResult:
        return await run_on_sandbox_loop(self._act(action))

    async def astep(self, action: str) -> StepResult:
        result = await super().astep(action)
        return await run_on_sandbox_loop(self._settle(result)) if self._unsettled(result) else result

    def step(self, action: str) -> StepResult:
        result = super().step(action)
        return run_on_sandbox_loop_sync(self._settle(result)) if self._unsettled(result) else result

    def _unsettled(self, result: StepResult) -> bool:
        """The episode ended without its tests (the turn limit after a refused reply): only then is a second trip
        to the sandbox loop needed, to run them."""
        return (result.terminated or result.truncated) and not self.ended and "error" not in result.info

    async def _settle(self, result: StepResult) -> StepResult:
        """Run the tests of an episode that ended without them (see :meth:`_unsettled`)."""
        try:
            reward, info = await self._finish("turn_limit")
        except Exception as exc:  # noqa: BLE001 - this episode ends; the batch goes on
            return await self._failed(exc)
        return StepResult(result.observation, result.reward + reward, result.terminated, True,
                          {**result.info, **info})

    async def _act(self, action: str) -> StepResult:
        try:
            return await self._act_inner(action)
        except Exception as exc:  # noqa: BLE001 - this episode ends; the batch goes on
            return await self._failed(exc)

    async def _failed(self, exc: Exception) -> StepResult:
        """End the episode on ``exc``: an env error before the agent's first command, scored after it."""
        if not self.agent_acted:
            return await self._error_result(exc)
        reason = f"{type(exc).__name__}: {exc}"
        log.info("task %s: the machine broke after the agent's commands; scored as the agent's failure: %s",
                 self.harbor_task.name, reason)
        self.counters["agent_failures"] += 1
        verified = len(self.verdicts) > self.step_index
        tests_ran = False
        if not self.ended and self.step_ready and not verified:
            try:
                await self._finish("agent_failure")
                tests_ran = True
            except Exception:  # noqa: BLE001 - the tests cannot run in what the agent left: reward 0
                log.debug("the tests could not run after the agent's failure", exc_info=True)
        self.ended = True
        try:
            await self._release_machine()
        except Exception:  # noqa: BLE001 - machines are swept by label/owner when their owner is gone
            log.warning("removing the task machine failed", exc_info=True)
        if not tests_ran and len(self.step_rewards) <= self.step_index:
            self.step_rewards.append(0.0)
        reward, info = self._summary("agent_failure")
        info["agent_failure"] = reason
        if not tests_ran:
            info["reward_problem"] = (f"the machine broke after the agent's commands ({reason}), and step "
                                      f"{self.current_step.name}'s tests could not run: its reward is 0")
        return StepResult([{"role": "user", "content": f"[the episode ended: {reason}]"}], reward, False, True, info)

    async def _act_inner(self, action: str) -> StepResult:
        parsed = parse_action(action)
        limit = self._agent_timeout()
        notes: list[str] = []
        blocks = parsed.commands
        if len(blocks) > self.config.max_commands_per_turn:
            self.counters["refused_blocks"] += len(blocks) - self.config.max_commands_per_turn
            notes.append(f"[only the first {self.config.max_commands_per_turn} command blocks ran]")
            blocks = blocks[:self.config.max_commands_per_turn]
        outputs: list[str] = []
        if blocks:
            shell = await self._ensure_shell()
            for block in blocks:
                left = limit - self.agent_seconds
                if left <= 0:
                    notes.append("[the agent's time for this task ran out; remaining commands were not run]")
                    break
                self.agent_acted = True
                result = await shell.run(block, min(self.config.command_timeout_s, left))
                self.agent_seconds += result.duration_s
                self.total_agent_seconds += result.duration_s
                outputs.append(self._describe(block, result, cut_by_agent_time=left < self.config.command_timeout_s))
        else:
            self.counters["no_command_turns"] += 1
            if not parsed.done:
                notes.append("No commands found. Put shell commands in a ```bash code block, or reply with <done/> "
                             "when the task is finished.")
        if parsed.other_blocks:
            notes.append(f"[{parsed.other_blocks} code block(s) in another language were not run; use ```bash]")
        observation = "\n\n".join(outputs + notes)
        out_of_time = self.agent_seconds >= limit
        if parsed.done or out_of_time:
            reason = "done" if parsed.done else "agent_timeout"
            return await self._end_step(observation, reason)
        if self.turn >= self.max_turns:
            reward, info = await self._finish("turn_limit")
            return StepResult([{"role": "user", "content": observation}], reward, False, True, info)
        return StepResult([{"role": "user", "content": observation}], 0.0, False, False, {})

    async def _end_step(self, observation: str, reason: str) -> StepResult:
        task = self.harbor_task
        step = self.current_step
        verdict = await self._verify_step()
        last = self.step_index == len(task.steps) - 1
        below = step.min_reward is not None and verdict.reward < step.min_reward
        if verdict.agent_failure:
            self.counters["agent_failures"] += 1
        if last or below or verdict.agent_failure or reason == "agent_timeout" or self.turn >= self.max_turns:
            reward, info = await self._finish(reason, verified=True)
            truncated = reason != "done" or (not last and not below)
            return StepResult([{"role": "user", "content": observation}] if observation else [], reward,
                              not truncated, truncated, info)
        self.step_index += 1
        self.agent_seconds = 0.0
        await self._start_step()
        text = f"{observation}\n\n" if observation else ""
        text += f"Step {self.step_index} is complete. Next:\n\n{self._step_prompt(self.current_step)}"
        return StepResult([{"role": "user", "content": text}], 0.0, False, False,
                          {"step_reward": verdict.reward, "step_reward_by_key": dict(verdict.rewards),
                           "step": step.name})

    async def _verify_step(self) -> Verdict:
        machine = await self._ensure_machine()
        self._shell = None  # verification kills it
        step = self.current_step
        timeout = self.config.verifier_timeout_s or step.verifier_timeout_sec
        cwd = machine.spec.workdir if self.config.verifier_cwd == "workdir" else self.config.verifier_cwd
        await self._collect_artifacts(machine, step)
        weights = self.config.reward_weights or self.harbor_task.reward_weights
        if step.tests_machine is not None:  # environment_mode = "separate": the tests run in a machine of their own
            assert self._provisioner is not None
            verdict = await verify_apart(self._provisioner, self.harbor_task, step, self.config, machine.backend,
                                         self.artifact_log, timeout, weights)
        else:
            verdict = await verify(machine, self.harbor_task, step, timeout, cwd=cwd, weights=weights)
        self.verdicts.append(verdict)
        self.step_rewards.append(verdict.reward)
        self.step_rewards_by_key.append(dict(verdict.rewards))
        self.timings["verify_s"] += verdict.duration_s
        return verdict

    async def _finish(self, reason: str, verified: bool = False) -> tuple[float, dict[str, Any]]:
        """Verify the current step unless done, remove the machine, combine the rewards."""
        try:
            if not verified and self._machine is not None:
                await self._verify_step()
        finally:
            self.ended = True
            await self._release_machine()
        return self._summary(reason)

    async def _collect_artifacts(self, machine: Machine, step: Step) -> None:
        """The step's and the task's artifacts, copied out once the agent's processes are gone (before the tests)."""
        artifacts = step.artifacts + self.harbor_task.artifacts + ((AGENT_ARTIFACTS,) if step.tests_machine else ())
        if step.collect:  # [verifier] collect: once the agent's processes are gone, before anything is copied out
            await machine.kill_processes()
            await run_collect_hooks(machine, step.collect, f"task {self.harbor_task.name}, step {step.name}")
        if not artifacts:
            return
        if self.artifact_log is None:
            root = Path(self.config.artifacts_dir) if self.config.artifacts_dir else default_artifacts_dir()
            self.artifact_log = ArtifactLog(episode_folder(root, self.harbor_task.name), self.config.max_artifact_bytes)
        if self.config.max_artifact_bytes == 0:
            self.artifact_log.problem(f"step {step.name}: not collected (env.max_artifact_bytes=0)")
            return
        try:
            await machine.kill_processes()  # nothing may change them while they are read
            await collect_artifacts(machine, artifacts, step.name, self.artifact_log)
        except Exception as exc:  # noqa: BLE001 - the verification says what is wrong with the machine
            log.debug("collecting artifacts failed", exc_info=True)
            self.artifact_log.problem(f"step {step.name}: not collected ({type(exc).__name__}: {exc})")

    def _combine_by_key(self) -> dict[str, float]:
        """Each reward key over the steps, combined as the steps' rewards are (a step without the key counts 0)."""
        task = self.harbor_task
        contributes = [step.contributes_to_reward for step in task.steps]
        keys = list(dict.fromkeys(key for rewards in self.step_rewards_by_key for key in rewards))[:MAX_KEYS]
        return {key: combine_rewards(task.reward_strategy, [rewards.get(key) for rewards in self.step_rewards_by_key],
                                     contributes) for key in keys}

    def _summary(self, reason: str) -> tuple[float, dict[str, Any]]:
        """The episode's reward from its steps' and what the last verification said."""
        task = self.harbor_task
        reward = combine_rewards(task.reward_strategy, self.step_rewards,
                                 [step.contributes_to_reward for step in task.steps])
        self.final_reward = reward
        while len(self.step_rewards_by_key) < len(self.step_rewards):  # a step scored 0 without its tests
            self.step_rewards_by_key.append({})
        self.rewards_by_key = self._combine_by_key()
        last = self.verdicts[-1] if self.verdicts else None
        info: dict[str, Any] = {"end_reason": reason, "task": task.name, "step_rewards": list(self.step_rewards),
                                "report": dict(self.report), "rewards": dict(self.rewards_by_key),
                                "step_rewards_by_key": [dict(rewards) for rewards in self.step_rewards_by_key]}
        if self.artifact_log is not None:
            info["artifacts"] = self.artifact_log.to_info()
        if last is None:
            info["reward_problem"] = "no command ever ran: the task's tests were not run"
        else:
            info.update(reward_source=last.source, verifier_exit_code=last.exit_code,
                        verifier_output_tail=last.output_tail[-1000:])
            if last.problem:
                info["reward_problem"] = last.problem
            if last.agent_failure:
                info["agent_failure"] = last.agent_failure
        return reward, info

    async def _ensure_machine(self) -> Machine:
        if self._machine is not None:
            return self._machine
        task = self.harbor_task
        refused = refusal(task, self.task, self.config.forgeable_tasks)
        if refused is not None:
            raise TaskEnvironmentError(refused)
        self._provisioner = provisioner(self.config)
        self.report = {"image source": image_source(task), "backend": "-", "build": "-"}
        backend = resolve_backend(self.config.backend, task)
        self.report.update(backend=backend, build="failed")
        try:
            started: Started = await self._provisioner.start(task, self.config, backend)
        except Exception:
            self._provisioner = None
            self.container_error = True
            raise
        self._machine = started.machine
        await build_tests_images(self._provisioner, task, self.config, backend)  # broken: an env error, as the task's
        await prepare_agent_machine(self._machine, task)
        self.report.update({"image source": image_source(task),  # now with what stood in for public images
                            "build": f"ok ({started.build_s:.1f} s)" if get_backend(backend).runs_images
                            else "replayed on the host"})
        self.timings.update(build_s=started.build_s, start_s=started.start_s, wait_s=started.wait_s)
        for warning in started.warnings:
            log.info("task %s: %s", task.name, warning)
        if task.environment.healthcheck is not None:  # once, before anything of the agent's: a failure is an env error
            await run_healthcheck(self._machine, task.environment.healthcheck, f"task {task.name}: the healthcheck")
        await self._start_step()
        return self._machine

    async def _start_step(self) -> None:
        assert self._machine is not None
        self.step_ready = False
        step = self.current_step
        # As Harbor: the step's workdir/ files first, then its setup.sh, then its healthcheck.
        await upload_step_workdir(self._machine, self.harbor_task, step)
        if step.setup_script is not None:
            # In a folder every backend can write (no process of the agent's runs now: the last verification
            # killed them), removed before the agent's next command.
            await self._machine.exec(["rm", "-rf", STEP_SETUP_DIR], cwd="/")
            await self._machine.put_files(STEP_SETUP_DIR, {"setup.sh": step.setup_script.read_bytes()})
            result = await self._machine.exec(["bash", f"{STEP_SETUP_DIR}/setup.sh"], timeout_s=120)
            await self._machine.exec(["rm", "-rf", STEP_SETUP_DIR], cwd="/")
            if not result.ok:
                raise TaskEnvironmentError(f"task {self.harbor_task.name}: setup of step {step.name} failed "
                                           f"(exit {result.exit_code}): {result.stderr.decode(errors='replace')[-800:]}")
        if step.healthcheck is not None:
            await run_healthcheck(self._machine, step.healthcheck,
                                  f"task {self.harbor_task.name}: the healthcheck of step {step.name}")
        if self.oracle:
            await self._machine.put_files("/solution", self.harbor_task.solution_files(step))
        self.step_ready = True

    async def _ensure_shell(self) -> TerminalSession:
        machine = await self._ensure_machine()
        if self._shell is None:
            self._shell = await machine.open_shell(max_output_bytes=self.config.max_output_bytes)
        return self._shell

    def _describe(self, block: str, result: CommandResult, cut_by_agent_time: bool = False) -> str:
        self.counters["commands"] += 1
        lines = [result.output] if result.output else []
        if result.omitted_bytes:
            self.counters["truncated_outputs"] += 1
        if result.timed_out:
            self.counters["command_timeouts"] += 1
            lines.append(f"[interrupted: the agent's time for this task ({self._agent_timeout():g} s) ran out]"
                         if cut_by_agent_time else
                         f"[interrupted: the command ran longer than {self.config.command_timeout_s:g} s]")
        elif result.exit_code is not None:
            lines.append(f"[exit status {result.exit_code}]")
        if result.shell_restarted:
            self.counters["shell_restarts"] += 1
            lines.append("[the shell exited or could not be interrupted and was started again: the working "
                         "directory, variables and background jobs were reset]")
        first = block.strip().splitlines()[0] if block.strip() else ""
        head = f"$ {first}" + (" ..." if block.strip().count("\n") else "")
        return "\n".join([head, *lines])

    def _agent_timeout(self) -> float:
        return self.config.agent_timeout_s or self.current_step.agent_timeout_sec

    async def _error_result(self, exc: BaseException) -> StepResult:
        """The episode ends with ``info["error"]``; its machine is removed before the result is returned."""
        self.ended = True
        self.container_error = True
        try:
            await self._release_machine()
        except Exception:  # noqa: BLE001 - machines are swept by label/owner when their owner is gone
            log.warning("removing the task machine failed", exc_info=True)
        return StepResult([], 0.0, False, True, {"error": f"{type(exc).__name__}: {exc}",
                                                 "task": self.task.get("name"), "report": dict(self.report)})

    # -- metrics and cleanup ------------------------------------------------------------------------

    def get_metrics(self) -> dict[str, float]:
        return {**{k: float(v) for k, v in self.counters.items()}, **self.timings,
                "passed": float((self.final_reward or 0.0) >= 1.0), "steps_verified": float(len(self.verdicts)),
                "agent_command_s": self.total_agent_seconds, "container_errors": float(self.container_error),
                "verifier_timeouts": float(sum(v.timed_out for v in self.verdicts)),
                "reward_file_missing": float(sum(v.source is None for v in self.verdicts)),
                **({"artifact_bytes": float(self.artifact_log.bytes)} if self.artifact_log else {}),
                **{f"reward/{key}": value for key, value in self.rewards_by_key.items()}}

    async def _release_machine(self) -> None:
        machine, self._machine = self._machine, None
        self._shell = None
        holder, self._provisioner = self._provisioner, None
        if machine is not None:
            try:
                await machine.close()
            finally:
                if holder is not None:
                    holder.release()

    def _close_machine(self) -> None:
        if self._machine is None:
            return
        try:
            run_on_sandbox_loop_sync(self._release_machine(), timeout=CLOSE_TIMEOUT_S)
        except Exception:  # noqa: BLE001 - machines are swept by label/owner when their owner is gone
            log.warning("closing the task machine failed", exc_info=True)

    def close(self) -> None:
        self._close_machine()
        super().close()

    def __getstate__(self) -> dict[str, Any]:
        """Pickle the task and config only; a machine never travels."""
        state = dict(self.__dict__)
        state.update(_machine=None, _provisioner=None, _shell=None)
        return state


def warn_where_the_tests_start(rows: Sequence[dict[str, Any]], verifier_cwd: str) -> None:
    """The task lint's findings that only hold for tests started in ``verifier_cwd`` (the loader assumes /tests)."""
    for row in rows:
        task = cached_task(row["task_path"])
        cwd = task_workdir(task) if verifier_cwd == "workdir" else verifier_cwd
        for finding in sorted(set(map(str, lint_task(task, cwd=cwd))) - set(map(str, lint_task(task)))):
            warnings.warn(f"{task.path}/{finding} (with env.verifier_cwd={verifier_cwd})", HarborTaskWarning,
                          stacklevel=3)


def resolve_backend(requested: str, task: HarborTask) -> str:
    """The backend that runs ``task``: ``requested``, or for ``auto`` the first strong backend that runs images and
    works here (its base image there or buildable), else, for a task the host's tools can stand in for
    (``base_packages_only``), the first strong backend with machines that runs none; TaskEnvironmentError when
    nothing can run it here."""
    if requested != "auto":
        return requested
    problems = []
    for name in _auto_image_backends():
        problem = _image_problem(name)
        if problem is None:
            return name
        problems.append(f"{name}: {problem}")
    compose = task.environment.compose
    if (task.environment.base_packages_only and not task.environment.tests_run_agent_code and compose is None
            and not task.separate_tests):
        host = next((name for name in strong_names()
                     if get_backend(name).has_machines and not get_backend(name).runs_images), None)
        if host is not None:
            return host
    needs = f"task {task.name} needs {container_runtime()}"
    why = f" and none works here ({'; '.join(problems)})" if problems else ""
    if compose is not None:
        raise TaskEnvironmentError(f"{needs} (its {compose.path.name} runs services beside the agent's machine){why}; "
                                   "start an engine (scripts/setup.sh does)")
    raise TaskEnvironmentError(f"{needs}{why}; start an engine (scripts/setup.sh does) or give the task "
                               "[metadata.skyrl] base_packages_only = true if the host's tools suffice")


def _auto_image_backends() -> list[str]:
    """The strong backends that run images, in the order ``auto`` tries them."""
    return [name for name in image_backends() if get_backend(name).strong]


@cache
def _image_problem(backend: str) -> str | None:
    """None when ``backend`` (one that runs images) works here and its base image is there or can be built."""
    chosen = get_backend(backend)
    return chosen.problem() or images.base_image_unavailable(chosen.engine)


