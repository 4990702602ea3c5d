"""Benchmark of the harbor_terminal env and its machines, per backend, beside host baselines measured in the same run.

For each installed backend with machines (docker, bwrap, and any other registered one):

- image build (backends that run images only): a cold build of a task image (a copy of a built-in task's environment
  folder under a fresh tag, with a new layer so nothing comes from the layer cache; the base image
  is present), a forced rebuild that the engine's layer cache answers, and the up-to-date check
  every episode's provisioning does (the context hash against the image's label). Baseline: the
  cold build. The bench images are removed afterwards; the real task images are not touched.
- machine start and close (p50/p99), a bare machine as the task's provisioning would ask for it.
- command round trip: ``true`` in the persistent shell (TerminalSession.run), p50/p99, beside a
  one-shot ``Machine.exec(["true"])`` and, as the floor, ``bash -c true`` as a host subprocess.
- full oracle episodes of a built-in task (reset, gold actions through ``await env.astep``, the
  task's tests, machine removed) at 1, 4 and 16 concurrent episodes with ``max_live_machines`` set
  to the concurrency: episodes per minute and the ratio to one at a time, and where an episode's
  time goes (the env's own timings). The env's start rate limit (``starts_per_second``, default 4)
  stays as configured unless ``--starts-per-second`` lifts it; it caps episodes per minute.

Every machine, container and bench image is removed on the way out, Ctrl-C included.

    python bench/harbor_terminal.py [--backend NAME|all] [--repeats 20] [--builds 3] [--commands 200]
                                    [--execs 100] [--concurrency 1,4,16] [--episodes 32]
                                    [--starts-per-second N] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import suppress
from pathlib import Path
from typing import Any

from skyrl_harbor_terminal.config import HarborTerminalConfig
from skyrl_harbor_terminal.env import BUILTIN_TASKS, HarborTerminalEnv, cached_task
from skyrl_harbor_terminal.images import TERMINAL_IMAGE
from skyrl_harbor_terminal.provision import Provisioner, image_backends, machine_engine
from skyrl_harbor_terminal.task import HarborTask
from skyrl_sandbox.backends.docker import images
from skyrl_sandbox.container_engine import ContainerEngine
from skyrl_sandbox.machine import Machine, MachineSpec
from skyrl_sandbox.machine_factory import machine_backends, start_machine
from skyrl_sandbox.registry import get_backend
from timing import percentile, timed

MS = 1000.0
BUILD_TASK = "count-lines"  # COPY + RUN: a typical small task image
EPISODE_TASK = "count-lines"
BENCH_REPOSITORY = "skyrl-harbor-bench"


class Cleanup:
    """Everything this run started, so that it is removed whatever happens."""

    def __init__(self) -> None:
        self.machines: set[Machine] = set()
        self.envs: list[HarborTerminalEnv] = []
        self.images: list[tuple[ContainerEngine, str]] = []
        self.engines: set[ContainerEngine] = set()  # the engines this run started containers on
        self.stopping = threading.Event()  # tells work running in threads (image builds) to stop

    async def close_async(self) -> None:
        self.stopping.set()
        for machine in list(self.machines):
            with suppress(Exception):
                await machine.close()
            self.machines.discard(machine)
        for env in self.envs:  # each env's machine lives on the sandbox loop; close() removes it there
            with suppress(Exception):
                await asyncio.to_thread(env.close)
        self.envs.clear()
        remove_images(self.images)

    def sweep(self) -> None:
        """Last resort, after the event loop is gone: containers labelled with this process, bench images."""
        remove_images(self.images)
        for engine in self.engines:
            self.sweep_engine(engine)

    def sweep_engine(self, engine: ContainerEngine) -> None:
        from skyrl_sandbox.backends.docker.worker import MACHINE_LABEL, OWNER_LABEL, machine_id, remove_container

        swept = set()
        with suppress(Exception):
            api = engine.shared_client().api
            for _ in range(2):  # a start cancelled mid-way may still be creating its container
                mine = api.containers(all=True, filters={"label": [f"{OWNER_LABEL}={os.getpid()}",
                                                                   f"{MACHINE_LABEL}={machine_id()}"]})
                for container in mine:
                    remove_container(api, container["Id"])
                    swept.add(container["Id"])
                if not mine:
                    break
                time.sleep(1.0)
        if swept:
            print(f"removed {len(swept)} container(s) of {engine.title} left by interrupted starts", file=sys.stderr)


def remove_images(tags: list[tuple[ContainerEngine, str]]) -> None:
    """Remove the bench's images; a tag stays listed until its engine says it is gone (a build may still run)."""
    if not tags:
        return
    import docker

    for engine, tag in list(tags):
        try:
            engine.shared_client().api.remove_image(tag, force=True)
        except docker.errors.ImageNotFound:
            pass
        except Exception:  # noqa: BLE001 - the sweep tries again
            continue
        images.forget(engine, tag)
        tags.remove((engine, tag))


CLEANUP = Cleanup()


# -- baselines ------------------------------------------------------------------------------------


def host_bash(runs: int) -> list[float]:
    """``bash -c true`` as a subprocess of this process: the floor of any command round trip."""
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run(["bash", "-c", "true"], check=True)
        samples.append(time.perf_counter() - started)
    return samples


# -- image builds (backends that run images) ------------------------------------------------------------------------


def stop_if_interrupted() -> None:
    if CLEANUP.stopping.is_set():
        raise RuntimeError("interrupted")


def build_times(engine: ContainerEngine, task: HarborTask, cold_runs: int, cached_runs: int
                ) -> tuple[list[float], list[float], list[float]]:
    """Seconds of cold builds, layer-cached forced rebuilds and up-to-date checks of a copy of ``task``'s image on
    ``engine``."""
    assert task.environment.context_dir is not None
    quiet = lambda line: None  # noqa: E731
    cold, layered, checks = [], [], []
    with tempfile.TemporaryDirectory(prefix="skyrl-bench-build-") as folder:
        context = Path(folder) / "environment"
        shutil.copytree(task.environment.context_dir, context)
        recipe = context / task.environment.dockerfile
        original = recipe.read_text()
        tag = ""
        for _ in range(cold_runs):
            stop_if_interrupted()
            nonce = secrets.token_hex(6)
            # A new layer right after FROM: every later step misses the layer cache, as for a new task.
            recipe.write_text(re.sub(r"^(\s*FROM\s+\S+.*)$", rf"\1\nLABEL skyrl.bench.nonce={nonce}", original,
                                     count=1, flags=re.IGNORECASE | re.MULTILINE))
            tag = f"{BENCH_REPOSITORY}/{BUILD_TASK}:cold-{nonce}"
            CLEANUP.images.append((engine, tag))
            started = time.perf_counter()
            images.build_image(engine, context, tag, dockerfile=task.environment.dockerfile, base=TERMINAL_IMAGE,
                               force=True, timeout_s=task.environment.build_timeout_sec, progress=quiet)
            cold.append(time.perf_counter() - started)
        for _ in range(cold_runs):
            stop_if_interrupted()
            started = time.perf_counter()
            images.build_image(engine, context, tag, dockerfile=task.environment.dockerfile, base=TERMINAL_IMAGE,
                               force=True, progress=quiet)
            layered.append(time.perf_counter() - started)
        for _ in range(cached_runs):
            stop_if_interrupted()
            started = time.perf_counter()
            images.build_image(engine, context, tag, dockerfile=task.environment.dockerfile, base=TERMINAL_IMAGE,
                               progress=quiet)
            checks.append(time.perf_counter() - started)
    remove_images(CLEANUP.images)
    return cold, layered, checks


# -- machines -------------------------------------------------------------------------------------


def machine_spec(task: HarborTask, image: str | None) -> MachineSpec:
    environment = task.environment
    return MachineSpec(image=image, workdir=environment.workdir or "/app", agent_user="agent",
                       cpus=min(environment.cpus, 2.0), memory_mb=environment.memory_mb,
                       storage_mb=environment.storage_mb)


async def open_machine(spec: MachineSpec, backend: str) -> Machine:
    """A started machine, registered for cleanup; a start interrupted half-way is finished and closed."""
    starting = asyncio.ensure_future(start_machine(spec, backend))
    try:
        machine = await asyncio.shield(starting)
    except asyncio.CancelledError:
        with suppress(BaseException):
            await (await starting).close()
        raise
    CLEANUP.machines.add(machine)
    return machine


async def close_machine(machine: Machine) -> None:
    try:
        await asyncio.shield(machine.close())
    finally:
        CLEANUP.machines.discard(machine)


async def start_close_times(spec: MachineSpec, backend: str, runs: int) -> tuple[list[float], list[float]]:
    await close_machine(await open_machine(spec, backend))  # warm-up: first-use probes, sweeps, caches
    starts, closes = [], []
    for _ in range(runs):
        started = time.perf_counter()
        machine = await open_machine(spec, backend)
        starts.append(time.perf_counter() - started)
        started = time.perf_counter()
        await close_machine(machine)
        closes.append(time.perf_counter() - started)
    return starts, closes


async def round_trips(spec: MachineSpec, backend: str, commands: int, execs: int) -> tuple[list[float], list[float]]:
    machine = await open_machine(spec, backend)
    try:
        shell = await machine.open_shell()
        for _ in range(5):
            await shell.run("true", 30)
        in_shell = await timed(commands, lambda: shell.run("true", 30))
        await machine.exec(["true"])
        one_shot = await timed(execs, lambda: machine.exec(["true"]))
        return in_shell, one_shot
    finally:
        await close_machine(machine)


# -- episodes -------------------------------------------------------------------------------------


async def episodes(row: dict[str, Any], backend: str, concurrency: int, count: int, starts_per_second: float | None
                   ) -> tuple[float, list[dict[str, Any]]]:
    """Oracle episodes, ``concurrency`` at a time: (seconds for all of them, per-episode results)."""
    config: dict[str, Any] = {"backend": backend, "max_live_machines": concurrency}
    if starts_per_second is not None:
        config["starts_per_second"] = starts_per_second
    envs = [HarborTerminalEnv(row, config) for _ in range(concurrency)]
    CLEANUP.envs.extend(envs)
    numbers = iter(range(count))
    results: list[dict[str, Any]] = []

    async def play(env: HarborTerminalEnv) -> None:
        for number in numbers:  # shared: each worker takes the next episode
            started = time.perf_counter()
            env.reset(seed=number)
            reward, error = 0.0, None
            for action in env.gold_actions() or []:
                result = await env.astep(action)
                reward += result.reward
                error = error or result.info.get("error")
                if result.terminated or result.truncated:
                    break
            results.append({"wall_s": time.perf_counter() - started, "reward": reward, "error": error,
                            **env.get_metrics()})

    started = time.perf_counter()
    try:
        await asyncio.gather(*(play(env) for env in envs))
    finally:
        for env in envs:
            await asyncio.to_thread(env.close)
            CLEANUP.envs.remove(env)
    return time.perf_counter() - started, results


# -- the table ------------------------------------------------------------------------------------


def row(metric: str, value: str, baseline: str, times: str) -> str:
    return f"| {metric:<46} | {value:>14} | {baseline:>26} | {times:>7} |"


def ratio(value: float) -> str:
    return f"{value:,.0f}x" if value >= 100 else f"{value:.1f}x" if value >= 1 else f"{value:.3f}x"


def ms_row(metric: str, value_s: float, base_s: float, base_name: str) -> str:
    return row(metric, f"{value_s * MS:,.2f} ms", f"{base_s * MS:,.2f} ms {base_name}", ratio(value_s / base_s))


def backend_problem(backend: str) -> str | None:
    problem = get_backend(backend).problem()
    engine = machine_engine(backend)
    if engine is not None:
        return problem or images.base_image_unavailable(engine, TERMINAL_IMAGE)
    if problem is None and shutil.which("setsid") is None:
        problem = "setsid (util-linux) is missing"
    return problem


async def bench_backend(backend: str, args: argparse.Namespace, notes: list[str]) -> list[str]:
    rows: list[str] = []
    build_task = cached_task(str(BUILTIN_TASKS / BUILD_TASK))
    episode_task = cached_task(str(BUILTIN_TASKS / EPISODE_TASK))
    image = None
    engine = machine_engine(backend)
    if engine is not None:
        CLEANUP.engines.add(engine)
        # The real task image, through the env's own provisioning (built here only if missing).
        image = await Provisioner(1, 100.0).image(episode_task, HarborTerminalConfig(), engine)
        cold, layered, checks = await asyncio.to_thread(build_times, engine, build_task, args.builds, args.repeats)
        base = statistics.median(cold)
        rows.append(row(f"{backend}: image build, cold (p50 of {len(cold)})", f"{base * MS:,.0f} ms", "", ""))
        rows.append(ms_row(f"{backend}: forced rebuild, layer cache (p50)", statistics.median(layered), base,
                           "(cold)"))
        rows.append(ms_row(f"{backend}: image up-to-date check (p50)", statistics.median(checks), base, "(cold)"))
        rows.append(ms_row(f"{backend}: image up-to-date check (p99)", percentile(checks, 99), base, "(cold)"))

    spec = machine_spec(episode_task, image)
    floor = host_bash(max(args.commands, 50))
    starts, closes = await start_close_times(spec, backend, args.repeats)
    for name, samples in (("machine start", starts), ("machine close", closes)):
        for q in (50, 99):
            rows.append(ms_row(f"{backend}: {name} (p{q})", percentile(samples, q), percentile(floor, q),
                               "(bash -c)"))
    in_shell, one_shot = await round_trips(spec, backend, args.commands, args.execs)
    for name, samples in (("shell round trip 'true'", in_shell), ("one-shot exec 'true'", one_shot)):
        for q in (50, 99):
            rows.append(ms_row(f"{backend}: {name} (p{q})", percentile(samples, q), percentile(floor, q),
                               "(bash -c)"))
    for q in (50, 99):
        rows.append(ms_row(f"{backend}: shell round trip vs one-shot (p{q})", percentile(in_shell, q),
                           percentile(one_shot, q), "(exec)"))

    task_row = {"task_path": str(episode_task.path), "name": episode_task.name}
    rate_limit = args.starts_per_second or HarborTerminalConfig().starts_per_second
    notes.append(f"{backend}: the env's start rate limit (starts_per_second = {rate_limit:g}) caps episodes at "
                 f"{rate_limit * 60:,.0f}/min whatever the concurrency")
    await episodes(task_row, backend, 1, 1, args.starts_per_second)  # warm-up: image check, first-use probes
    base_rate = None
    for level in args.concurrency:
        count = max(args.episodes, level)
        elapsed, results = await episodes(task_row, backend, level, count, args.starts_per_second)
        per_minute = count / elapsed * 60
        base_rate = base_rate or per_minute
        passed = sum(r["reward"] >= 1.0 for r in results)
        label = f"{backend}: episodes, {level} concurrent ({passed}/{count} pass)"
        rows.append(row(label, f"{per_minute:,.1f} ep/min", f"{base_rate:,.1f} ep/min (1 at a time)",
                        f"{per_minute / base_rate:,.2f}x"))
        errors = sorted({str(r["error"])[:200] for r in results if r["error"]})
        notes += [f"{backend}, {level} concurrent: {error}" for error in errors]
        notes.append(f"{backend}, {level} concurrent: " + where_time_goes(results))
    return rows


def where_time_goes(results: list[dict[str, Any]]) -> str:
    mean = {key: statistics.mean(r[key] for r in results)
            for key in ("wall_s", "build_s", "wait_s", "start_s", "agent_command_s", "verify_s")}
    accounted = mean["build_s"] + mean["wait_s"] + mean["start_s"] + mean["agent_command_s"] + mean["verify_s"]
    return (f"episode wall {mean['wall_s'] * MS:,.0f} ms (mean) = image check {mean['build_s'] * MS:,.0f} + slot wait "
            f"{mean['wait_s'] * MS:,.0f} + machine start {mean['start_s'] * MS:,.0f} + solve.sh "
            f"{mean['agent_command_s'] * MS:,.0f} + tests {mean['verify_s'] * MS:,.0f} + rest (rate limit, shell "
            f"open, /solution copy, close) {(mean['wall_s'] - accounted) * MS:,.0f}")


async def run(args: argparse.Namespace) -> None:
    rows, notes, skipped = [], [], []
    try:
        for backend in args.backends:
            problem = backend_problem(backend)
            if problem:
                skipped.append(f"{backend}: {problem}")
                continue
            rows += await bench_backend(backend, args, notes)
    finally:
        await CLEANUP.close_async()
    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    print(f"\nharbor_terminal benchmark (task {EPISODE_TASK}; baselines measured in this run: `bash -c true` as a host "
          f"subprocess, one-shot exec, cold build, 1 episode at a time; {os.cpu_count()} CPUs, load average {load})\n")
    print(row("metric", "measured", "baseline", "ratio"))
    print(f"|{'-' * 48}|{'-' * 16}|{'-' * 28}|{'-' * 9}|")
    print("\n".join(rows))
    if notes:
        print()
    for line in notes:
        print(f"- {line}")
    for line in skipped:
        print(f"\nnot measured: {line}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=(*machine_backends(), "all"),
                        default=(*image_backends(), *machine_backends())[0],
                        help="machines to measure (default: the first installed backend that runs images)")
    parser.add_argument("--repeats", type=int, default=20, help="machine starts/closes and image up-to-date checks")
    parser.add_argument("--builds", type=int, default=3, help="cold image builds (and layer-cached rebuilds)")
    parser.add_argument("--commands", type=int, default=200, help="shell round trips (and host baseline runs)")
    parser.add_argument("--execs", type=int, default=100, help="one-shot execs")
    parser.add_argument("--concurrency", default="1,4,16", help="comma-separated concurrent episodes per level")
    parser.add_argument("--episodes", type=int, default=32, help="episodes per level (at least the concurrency)")
    parser.add_argument("--starts-per-second", type=float, default=None,
                        help="the env's machine start rate limit (default: the env's own default)")
    parser.add_argument("--quick", action="store_true", help="small counts, for a smoke run")
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.builds, args.commands, args.execs, args.episodes = 5, 1, 40, 20, 4
    args.backends = list(machine_backends()) if args.backend == "all" else [args.backend]
    args.concurrency = [int(level) for level in args.concurrency.split(",")]
    try:
        asyncio.run(run(args))
    except KeyboardInterrupt:
        print("\ninterrupted: machines and bench images removed", file=sys.stderr)
        raise SystemExit(130) from None
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not stop the sweep
        CLEANUP.sweep()


if __name__ == "__main__":
    main()
