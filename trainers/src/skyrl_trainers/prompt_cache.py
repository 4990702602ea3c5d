"""Run each prompt of a mini-batch once, however many micro-batches its samples fill.

A GRPO group is one prompt and ``n`` samples; a micro-batch row holds the prompt once and as many
samples as fit, so a group spread over ``k`` rows ran its prompt ``k`` times (the main job: a 117-token
prompt in about a third of every row). Here the prompt but its last token runs once per mini-batch
without gradient, and its keys and values per layer become leaf tensors that every micro-batch's rows
attend to (:mod:`skyrl_trainers.forward`, ``carry_prompts``). Each micro-batch's backward sums its
gradient with respect to those keys and values into the leaves; :meth:`PromptCache.backward` then runs
each prompt again with gradient (under the random state of its first run, so dropout draws the same
masks) and sends the sums through it. The weights get the same gradient as when every row ran its own
prompt (up to float summation order), and only one prompt's activations are alive at a time.

This needs the rows' attention to be :func:`~skyrl_trainers.forward.install_shared_prompt_sdpa`'s
(transformers' ``sdpa``) and a model whose parameters stay in place between forward and backward: an
FSDP2-sharded model frees a layer's gathered weights after its forward and gathers them again only
when the gradient reaches the layer's output, which the keys' gradient never does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from skyrl_trainers.forward import CarriedPrompts, install_shared_prompt_sdpa

LayerStates = list[tuple[torch.Tensor, torch.Tensor]]  # per layer, ``[1, kv_heads, P, d]`` keys and values


class PromptCache:
    """The keys and values of carried prompts, per model, for the micro-batches of one mini-batch."""

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        self._states: dict[tuple[int, tuple[int, ...]], LayerStates] = {}
        self._random_states: dict[tuple[int, tuple[int, ...]], list[torch.Tensor]] = {}

    def rows(self, model: torch.nn.Module, prompts: Sequence[tuple[int, ...]]) -> CarriedPrompts | None:
        """Per layer, ``[r, kv_heads, C, d]`` keys and values of ``prompts`` (one per row, right-padded to the
        longest, ``C``) under ``model``; ``None`` when every prompt is empty."""
        width = max(len(p) for p in prompts)
        if width == 0:
            return None
        states = [self._states_of(model, p) if p else None for p in prompts]
        like = next(s for s in states if s is not None)

        def stacked(layer: int, which: int) -> torch.Tensor:
            parts = []
            for state in states:
                t = like[layer][which][:, :, :0] if state is None else state[layer][which]
                parts.append(torch.nn.functional.pad(t, (0, 0, 0, width - t.shape[2])))
            return torch.cat(parts)

        return [(stacked(layer, 0), stacked(layer, 1)) for layer in range(len(like))]

    def backward(self, model: torch.nn.Module) -> None:
        """Send the gradient the micro-batches left on ``model``'s prompt states through those prompts."""
        for (owner, prompt), leaves in self._states.items():
            flat = [t for pair in leaves for t in pair]
            if owner != id(model) or all(t.grad is None for t in flat):
                continue
            with torch.random.fork_rng(devices=self._rng_devices()):
                self._set_random_state(self._random_states[owner, prompt])
                outputs = [t for pair in _prompt_states(model, prompt, self.device) for t in pair]
            pairs = [(out, leaf.grad) for out, leaf in zip(outputs, flat, strict=True) if leaf.grad is not None]
            torch.autograd.backward([out for out, _ in pairs], [grad for _, grad in pairs])

    def _states_of(self, model: torch.nn.Module, prompt: tuple[int, ...]) -> LayerStates:
        key = (id(model), prompt)
        if key not in self._states:
            self._random_states[key] = self._random_state()
            with torch.no_grad():
                states = _prompt_states(model, prompt, self.device)
            self._states[key] = [(k.detach().requires_grad_(), v.detach().requires_grad_()) for k, v in states]
        return self._states[key]

    def _rng_devices(self) -> list[torch.device]:
        return [self.device] if self.device.type == "cuda" else []

    def _random_state(self) -> list[torch.Tensor]:
        return [torch.get_rng_state()] + [torch.cuda.get_rng_state(d) for d in self._rng_devices()]

    def _set_random_state(self, state: list[torch.Tensor]) -> None:
        torch.set_rng_state(state[0])
        for device, device_state in zip(self._rng_devices(), state[1:], strict=True):
            torch.cuda.set_rng_state(device_state, device)


def _prompt_states(model: Callable[..., Any], prompt: tuple[int, ...], device: torch.device) -> LayerStates:
    """Each layer's keys and values (after the rotary embedding) of ``model`` on ``prompt`` from position 0."""
    install_shared_prompt_sdpa()
    ids = torch.tensor([prompt], device=device)
    record: LayerStates = []
    model(input_ids=ids, position_ids=torch.arange(len(prompt), device=device)[None], use_cache=False,
          logits_to_keep=1, record=record)
    return record
