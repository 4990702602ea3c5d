"""Build the rollout engine for a training run: it must generate with the policy being trained.

The engine loads ``trainer.model`` itself (``hf``: a copy in the driver process; ``vllm``: its own
GPU copy), and the trainer pushes its weights into it before the first rollout and after every step.
One exception (:func:`can_share_weights`): an ``hf`` engine beside a single in-process rank on the same
device generates with that rank's own parameter storage (:func:`shared_engine`), so nothing is copied.

``trainer.engine_placement`` puts the engine in the driver (``in_process``), in a spawned child process
(``process``) or in a Ray actor (``ray``), behind the same protocol (:mod:`.engines.remote`); a placed
engine always holds its own copy of the weights. ``engine.replicas`` > 1 (only with ``ray``) runs that many
actors behind one client that routes requests among them (:mod:`.engines.replicas`).
"""

from __future__ import annotations

import os
from typing import Any

import torch
from skyrl_core.config import ResolvedConfig
from skyrl_core.engine import ClosableEngine, ReportingEngine, SleepableEngine, TokenizingEngine
from skyrl_core.factory import ConfigError
from skyrl_core.plugins import get_registry


def engine_config_for_policy(config: ResolvedConfig, seed: int | None = None) -> Any:
    """The engine section with ``model`` set to ``trainer.model`` (an explicit mismatch is an error) and,
    unless the user chose them, its sampling ``seed`` set to ``seed``, its ``packed_dtype`` following an
    explicit ``trainer.precision`` and, off ``trainer.mode=sync``, ``in_flight_updates`` set to ``keep`` (an
    update then lands between decode steps instead of waiting for the longest episode in flight, which
    would stall generation at every step)."""
    engine_cfg, policy = config.engine, config.trainer.model
    if engine_cfg is None:
        return engine_cfg
    fields, chosen = type(engine_cfg).model_fields, engine_cfg.model_fields_set
    update: dict[str, Any] = {}
    if "model" in fields:
        if "model" in chosen and engine_cfg.model not in (None, policy):
            raise ConfigError(f"engine.model={engine_cfg.model!r} differs from trainer.model={policy!r}; the engine "
                              "generates with the policy being trained, so set only trainer.model")
        update["model"] = policy
    if "seed" in fields and "seed" not in chosen and seed is not None:
        update["seed"] = seed
    if "in_flight_updates" in fields and "in_flight_updates" not in chosen and config.trainer.mode != "sync":
        update["in_flight_updates"] = "keep"
    precision = config.trainer.precision
    if "packed_dtype" in fields and "packed_dtype" not in chosen and precision != "auto":
        update["packed_dtype"] = "bfloat16" if precision == "bf16" else "float32"  # sample as the trainer trains
    return engine_cfg.model_copy(update=update)


def engine_class(config: ResolvedConfig) -> Any:
    return get_registry().get("engine", config.engine_id).load()


def check_engine_placement(config: ResolvedConfig) -> None:
    """Refuse ``engine.replicas`` > 1 unless ``trainer.engine_placement=ray`` (each replica is a Ray actor)."""
    replicas = getattr(config.engine, "replicas", 1)  # an engine option: only some engines have it
    placement = config.trainer.engine_placement
    if replicas > 1 and placement != "ray":
        raise ConfigError(f"engine.replicas={replicas} runs each engine replica as a Ray actor, but "
                          f"trainer.engine_placement={placement}; set trainer.engine_placement=ray "
                          "(or engine.replicas=1)")


def engine_metrics(engine: Any) -> dict[str, float]:
    """What the engine reports about itself for the step's metrics (a :class:`ReportingEngine`'s
    ``engine_metrics()``, e.g. requests per replica), else ``{}``."""
    return dict(engine.engine_metrics()) if isinstance(engine, ReportingEngine) else {}


def build_engine(config: ResolvedConfig, seed: int | None = None, worker: Any = None) -> tuple[Any, Any]:
    """``(engine, tokenizer)`` for the run's ``engine`` section, loaded with ``trainer.model``, or sharing
    ``worker``'s weights when one is given (see :func:`shared_engine`)."""
    check_engine_placement(config)
    cls, engine_cfg = engine_class(config), engine_config_for_policy(config, seed)
    placement = config.trainer.engine_placement
    if placement != "in_process" and worker is not None:
        raise ConfigError(f"trainer.engine_placement={placement} cannot share the trainer's weights; "
                          "build the engine without a worker")
    if placement == "process":
        from skyrl_trainers.engines.remote import ProcessEngine

        engine = ProcessEngine(cls, engine_cfg)
    elif placement == "ray":
        from skyrl_trainers.engines.remote import RayEngine
        from skyrl_trainers.engines.replicas import RayEngineReplicas

        cfg, replicas = config.trainer, getattr(engine_cfg, "replicas", 1)
        # joins a Ray that is already running (e.g. the one run.ray_address connected), else this address
        options = {"address": cfg.ray_address or config.run.ray_address,
                   "num_gpus": _engine_gpus(engine_cfg),
                   "num_cpus": max(os.cpu_count() or 1, cfg.world_size + replicas)}  # room for backend=ray ranks
        engine = (RayEngineReplicas(cls, engine_cfg, replicas, **options) if replicas > 1
                  else RayEngine(cls, engine_cfg, **options))
    else:
        engine = shared_engine(worker, engine_cfg, cls) if worker is not None else cls(engine_cfg)
    tokenizer = engine.tokenizer if isinstance(engine, TokenizingEngine) else None
    if tokenizer is None:
        if isinstance(engine, ClosableEngine):
            engine.close()
        raise ConfigError(f"engine {config.engine_id!r} exposes no tokenizer; the trainer needs one to build prompts")
    return engine, tokenizer


def _engine_gpus(engine_cfg: Any) -> int:
    """GPUs a Ray actor holding the engine reserves: its tensor-parallel size on CUDA, else 0."""
    return int(getattr(engine_cfg, "tensor_parallel_size", 1) or 1) if _engine_on_cuda(engine_cfg) else 0


def _engine_on_cuda(engine_cfg: Any) -> bool:
    from skyrl_trainers.engines.vllm import VLLMEngineConfig

    if isinstance(engine_cfg, VLLMEngineConfig):
        return True  # CUDA only (no device option)
    device = str(getattr(engine_cfg, "device", "") or "")
    if device == "auto":
        return torch.cuda.is_available()
    return device.startswith("cuda")


def sleeps_between_rollouts(engine: Any) -> bool:
    """True for an engine that can free its GPU memory while the trainer runs (vLLM with
    ``engine.enable_sleep_mode=true``): it is put to sleep after each rollout and woken for the weight sync."""
    config = getattr(engine, "config", None)  # the engine's own options: only vLLM's have enable_sleep_mode
    return isinstance(engine, SleepableEngine) and bool(getattr(config, "enable_sleep_mode", False))


def can_share_weights(config: ResolvedConfig, engine_cls: Any) -> bool:
    """True when the engine may generate with the trainer's own parameters instead of a copy: one
    in-process rank (``world_size=1``, backend local), the ``hf`` engine placed in process
    (``engine_placement=in_process``) without sleep mode, on the trainer's device and in its float32
    parameter dtype, in ``sync`` mode (an engine that generates while the trainer updates must hold
    its own copy)."""
    from skyrl_trainers.engines.hf import HFEngine, resolve_device
    from skyrl_trainers.models import resolve_dtype
    from skyrl_trainers.worker import resolve_device as trainer_device

    cfg, engine_cfg = config.trainer, config.engine
    if cfg.engine_placement != "in_process" or cfg.mode != "sync":
        return False
    if cfg.world_size != 1 or cfg.backend != "local" or not (isinstance(engine_cls, type) and issubclass(engine_cls, HFEngine)):
        return False
    if engine_cfg is None or getattr(engine_cfg, "enable_sleep_mode", False):
        return False
    device = resolve_device(engine_cfg.device)
    return device == trainer_device(cfg.device) and resolve_dtype(engine_cfg.dtype, device) == torch.float32


def shared_engine(worker: Any, engine_config: Any, engine_cls: Any = None) -> Any:
    """An ``hf`` engine whose model aliases the parameter storage of ``worker`` (a world-size-1 rank).

    A single rank trains the plain (unsharded) module, so a second module built around its tensors
    (:func:`alias_policy`) holds no copy, and the optimizer's in-place updates are seen by the engine at
    once; the engine keeps its own module object so that its ``eval()`` never touches the trainer's
    mode. Safe because sync training only generates while the trainer is idle.
    """
    from transformers import AutoModelForCausalLM

    from skyrl_trainers.engines.hf import HFEngine

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(worker.hf_config, dtype=torch.float32)
    model.generation_config = worker.model.generation_config
    alias_policy(model, worker.model)
    return (engine_cls or HFEngine).from_model(model, worker.tokenizer, engine_config)


def alias_policy(model: torch.nn.Module, policy: torch.nn.Module) -> bool:
    """Point ``model``'s parameters and buffers at ``policy``'s tensors, copying nothing; returns whether
    anything had to be re-pointed (e.g. after a checkpoint load replaced the policy's storage)."""
    changed = False
    with torch.no_grad():
        for kind, named in (("parameters", policy.named_parameters()), ("buffers", policy.named_buffers())):
            for name, tensor in named:
                owner_name, _, attr = name.rpartition(".")
                owner = model.get_submodule(owner_name)
                current = getattr(owner, attr)
                if current is not None and not current.is_meta and current.data_ptr() == tensor.data_ptr():
                    continue
                if kind == "parameters":
                    owner._parameters[attr] = torch.nn.Parameter(tensor.detach(), requires_grad=False)
                else:
                    owner._buffers[attr] = tensor.detach()
                changed = True
    model.tie_weights()
    return changed
