"""skyrl-trainers: the ``fsdp_grpo`` trainer, the ``hf`` and ``vllm`` inference engines, RL algorithms.

Importing this package is cheap; torch and transformers load only when a component is made.
"""
