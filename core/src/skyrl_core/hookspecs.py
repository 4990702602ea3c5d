"""The hooks a SkyRL plugin can implement.

Every ``register_*`` hook receives a ``register`` callback and calls it once per component it
provides (zero or many times); core records which distribution supplied each id. Observer hooks
(``on_*``) are events: they return nothing; one that raises is logged once (naming its plugin) and never
fails an episode or a step.

Plugins import :data:`skyrl_core.hookimpl` and never pluggy itself::

    from skyrl_core import EnvSpec, hookimpl

    @hookimpl
    def register_envs(register):
        register(EnvSpec(id="reverse_text", entry_point="skyrl_reverse_text.env:ReverseTextEnv"))
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    import typer

    from skyrl_core.probe import Probe
    from skyrl_core.registry import ComponentSpec
    from skyrl_core.trajectory import Trajectory

hookspec = pluggy.HookspecMarker("skyrl")
hookimpl = pluggy.HookimplMarker("skyrl")

Register = Callable[["ComponentSpec"], None]


# -- registration: called once per plugin when the registry is first built ----------------------


@hookspec
def register_envs(register: Register) -> None:
    """Register text environments.

    Fires once per plugin the first time any registry lookup happens. Call ``register(EnvSpec(...))``
    for every environment the plugin provides. Nothing heavy may be imported here: the spec's
    ``entry_point`` is a ``"module:attr"`` string imported only when the env is made.
    """


@hookspec
def register_generators(register: Register) -> None:
    """Register rollout generators (``GeneratorSpec``).

    Fires like :func:`register_envs`. A generator turns tasks into trajectories by driving an
    inference engine and environments; core's ``default`` generator is registered through this hook.
    """


@hookspec
def register_trainers(register: Register) -> None:
    """Register trainers (``TrainerSpec``), e.g. ``fsdp_grpo`` from ``skyrl-trainers``.

    Fires like :func:`register_envs`.
    """


@hookspec
def register_inference_engines(register: Register) -> None:
    """Register inference engines (``EngineSpec``) implementing :class:`skyrl_core.InferenceEngine`.

    Fires like :func:`register_envs`. Core's ``openai`` engine is registered through this hook.
    """


@hookspec
def register_probes(register: Callable[[Probe], None]) -> None:
    """Register adversarial probes (:class:`skyrl_core.probe.Probe`) for ``skyrl check --adversarial``.

    Fires once per plugin the first time the checker runs. Call ``register(Probe(..., env="my_env"))``
    for each hostile scripted policy that only this plugin can write (a background process left
    running, a forged result, text placed where the check reads it). A probe must never be given the
    task's answer: it scores above the null agent only through a bug of the env's. Its ``act`` runs
    in the checker's process; keep the module that defines it light.
    """


@hookspec
def register_commands(cli: typer.Typer) -> None:
    """Add sub-commands to the ``skyrl`` command line.

    Fires once when the CLI is built, before arguments are parsed. Use ``@cli.command()``; keep
    heavy imports inside the command body so ``skyrl --help`` stays fast.
    """


# -- listing: called by ``skyrl plugins`` ------------------------------------------------------------


@hookspec
def entry_point_groups() -> list[str]:
    """Name the entry-point groups through which other packages extend this plugin.

    For a plugin with a registry of its own that third-party packages fill through entry points, such
    as skyrl-search's retrievers (``["skyrl_search.retrievers"]``). ``skyrl plugins`` lists, under this
    plugin's ``extensions``, every entry point installed in each group: ``{group: [{"name", "value",
    "provider", "version"}, ...]}``, where ``provider`` is the distribution that declares it. Return the
    names only: nothing is loaded. One that raises is logged and listed with no extensions.
    """


# -- cluster nodes: called on each machine that hosts env workers (generator.env_placement=ray) -----------


@hookspec
def node_resources() -> dict[str, float]:
    """Return the custom Ray resources this machine offers env workers, e.g. ``{"docker": 8, "bwrap": 8}``.

    Called by ``skyrl node-resources`` (whose JSON goes to ``ray start --resources``) and when a run starts
    a local Ray of its own. Each key is a resource an env may ask for in :meth:`TextEnv.ray_resources`;
    the value is how many env workers needing it the machine can host. Check that the thing works here
    (a backend that answers), not only that it is installed. Results of several plugins are merged,
    the larger amount winning.
    """


@hookspec
def sweep_orphans() -> dict[str, int]:
    """Remove what processes that died without cleaning up left on this machine; return counts by kind.

    Called in every env worker when it starts and, after a worker was lost, once on every live node of
    the cluster, so containers and sandboxes of a killed worker do not outlive it. Must only touch
    resources whose owner is provably dead, and must be safe to call concurrently and repeatedly.
    """


# -- observers: events fired while running; implementations must be cheap (a raise is caught and logged) --


@hookspec
def on_rollout_end(trajectory: Trajectory) -> None:
    """Called after every finished episode (root or child) with its trajectory.

    Fires from the generator's event loop, so it must not block. Use it for custom logging or
    filtering statistics; mutating the trajectory is allowed but discouraged.
    """


@hookspec
def on_train_step_end(step: int, metrics: dict[str, Any]) -> None:
    """Called by trainers after each optimizer step with the step number and its metrics.

    ``metrics`` is the same flat ``{name: float}`` dict written to ``metrics.jsonl``.
    """
