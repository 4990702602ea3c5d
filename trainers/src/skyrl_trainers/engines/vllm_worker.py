"""Methods mixed into vLLM's GPU workers (``worker_extension_cls``), called through ``collective_rpc``.

This module is imported inside vLLM's worker processes, so it must not import vLLM itself at the
top level and must stay importable by its dotted path ``skyrl_trainers.engines.vllm_worker``.
"""

from __future__ import annotations

from typing import Any


class WeightLoaderExtension:
    """Loads trainer weights into the worker's model in place (``self`` is vLLM's worker)."""

    model_runner: Any

    def skyrl_load_weights(self, named_tensors: list[tuple[str, Any]]) -> int:
        """Load ``(hf_name, tensor)`` pairs with the model's own ``load_weights`` (handles fused layers)."""
        model = self.model_runner.model
        device = next(model.parameters()).device
        model.load_weights(weights=[(name, tensor.to(device)) for name, tensor in named_tensors])
        return len(named_tensors)
