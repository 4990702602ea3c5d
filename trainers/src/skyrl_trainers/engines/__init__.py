"""Inference engines implementing skyrl-core's ``InferenceEngine`` protocol: ``hf`` and ``vllm``.

Submodules import torch, transformers or vLLM; this package itself imports nothing heavy.
"""
