"""Registers this distribution's components with skyrl-core (entry point group ``skyrl``)."""

from __future__ import annotations

from skyrl_core import EngineSpec, TrainerSpec, hookimpl
from skyrl_core.hookspecs import Register


@hookimpl
def register_trainers(register: Register) -> None:
    register(TrainerSpec(
        id="fsdp_grpo", entry_point="skyrl_trainers.trainer:FSDPGRPOTrainer",
        description="GRPO/PPO-style policy optimisation with PyTorch FSDP2 (CPU gloo or CUDA NCCL), local or Ray.",
        config="skyrl_trainers.config:FSDPGRPOConfig"))


@hookimpl
def register_inference_engines(register: Register) -> None:
    register(EngineSpec(
        id="hf", entry_point="skyrl_trainers.engines.hf:HFEngine",
        description="Hugging Face transformers generation on CPU or GPU, batching concurrent requests.",
        config="skyrl_trainers.engines.hf:HFEngineConfig"))
    register(EngineSpec(
        id="vllm", entry_point="skyrl_trainers.engines.vllm:VLLMEngine",
        description="In-process vLLM on GPU with weight updates from the trainer.",
        config="skyrl_trainers.engines.vllm:VLLMEngineConfig", needs_gpu=True))
