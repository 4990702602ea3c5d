"""Collate training samples into model inputs and compute per-token log-probs and entropy.

Samples that share a prompt (the samples of a GRPO group) are packed into one row: the prompt once,
then each sample's response, with an attention mask under which every response sees the prompt and
its own earlier tokens only, and position ids that restart after the prompt for each response. The
forward pass then runs the prompt once per group instead of once per sample (identical results; a
GRPO step of 8 prompts x 4 samples with 38-token prompts runs about a third fewer tokens). Under sdpa
the packed rows' attention runs as small blocks (:class:`SharedPromptAttention`) rather than under the
full ``[L, L]`` mask, whose kernel would compute every masked-out score.

A group's samples are more than one micro-batch holds, so each pack of them would run the prompt
again. With ``carry_prompts`` a row holds only the prompt's last token (it predicts the first response
token) and its attention also reads the rest of the prompt as keys and values that a
:class:`~skyrl_trainers.prompt_cache.PromptCache` computed once for every micro-batch of the mini-batch.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from skyrl_trainers.batching import TrainSample, shared_prompt_rows

# Attention implementations that take an arbitrary 4D mask (others get one sample per row).
PACKABLE_ATTENTION = frozenset({"sdpa", "eager"})
# Per layer, the keys and values of each row's carried prompt: ``[r, kv_heads, C, d]`` each.
CarriedPrompts = list[tuple[torch.Tensor, torch.Tensor]]


@dataclass
class SharedPromptAttention:
    """The packed rows' attention as small independent blocks: each row's prompt and first sample (its first
    ``first`` positions, causal), then each further sample's queries against the prompt's keys and its
    own (``B`` blocks gathered from the rows).

    With carried prompts every row's keys start with ``carried`` slots for its prompt's carried part (a
    shorter prompt leaves padding there): keys live in ``r * (carried + L)`` flat positions, queries in
    ``r * L``, and ``first_mask`` (``[r, 1, first, carried + first]``) is the first blocks' mask (``None``
    without carried prompts: plainly causal).

    ``mask`` (True: may attend) is causal by row position, lets every query see the carried prompt and
    hides the blocks' padding; ``output`` gives each position its slot in the ``[r * first]`` outputs of
    the first blocks followed by the ``[B * Q]`` of the others (row padding reads an arbitrary slot:
    nothing depends on it). For ``n`` responses of ``R`` tokens after a ``P``-token prompt the attention
    costs about ``(P + R) ** 2 / 2 + (n - 1) * R * (P + R)`` instead of ``(P + n * R) ** 2`` under the 4D mask.
    """

    first: int
    queries: torch.Tensor  # [B, Q]
    keys: torch.Tensor     # [B, K]
    mask: torch.Tensor     # [B, 1, Q, K]
    output: torch.Tensor   # [r * L]
    carried: int = 0
    first_mask: torch.Tensor | None = None

    def to(self, device: torch.device | str) -> SharedPromptAttention:
        return SharedPromptAttention(self.first, *(t.to(device) for t in (self.queries, self.keys, self.mask,
                                                                            self.output)),
                                     self.carried, None if self.first_mask is None else self.first_mask.to(device))


@dataclass
class MicroBatch:
    """Model inputs of one micro-batch (``r`` packed rows of length ``L``) and per-sample targets.

    Per-sample tensors are ``[n, W]``: column ``w`` is sample ``i``'s response token ``w``
    (``targets``), predicted by the hidden state at flat index ``predictors[i, w]`` of the ``[r * L]``
    positions. ``attention_mask`` is ``[r, L]`` (padding only) when no row is shared, else a boolean
    ``[r, 1, L, L]`` mask (True: may attend). ``carried_prompts`` (with ``carry_prompts``) is each row's
    prompt but its last token, which the row leaves out (see :mod:`skyrl_trainers.prompt_cache`).
    """

    input_ids: torch.Tensor       # [r, L]
    position_ids: torch.Tensor    # [r, L]
    attention_mask: torch.Tensor  # [r, L] or [r, 1, L, L]
    predictors: torch.Tensor      # [n, W] flat indices into the r * L positions
    targets: torch.Tensor         # [n, W]
    mask: torch.Tensor            # [n, W], 1 where a generated token is trained on
    rollout_logprobs: torch.Tensor
    advantages: torch.Tensor      # [n, W], the sequence's advantage on every position
    shared_prompt: SharedPromptAttention | None = None  # with the 4D mask: the same attention, less work
    carried_prompts: list[tuple[int, ...]] | None = None

    def to(self, device: torch.device | str) -> MicroBatch:
        return MicroBatch(*(t.to(device) for t in (self.input_ids, self.position_ids, self.attention_mask,
                                                    self.predictors, self.targets, self.mask,
                                                    self.rollout_logprobs, self.advantages)),
                          None if self.shared_prompt is None else self.shared_prompt.to(device),
                          self.carried_prompts)

    @property
    def num_positions(self) -> int:
        """Positions the model runs (padding included)."""
        return self.input_ids.numel()


def collate(samples: Sequence[TrainSample], pad_id: int = 0, *, pack: bool = True,
            carry_prompts: bool = False) -> MicroBatch:
    """Pack ``samples`` into rows (shared prompts once, see :func:`~.batching.shared_prompt_rows`) and
    right-pad them; an empty list gives a 2-token dummy row with nothing to train on. With
    ``carry_prompts`` (packed rows only) a row keeps only its prompt's last token."""
    if not samples:
        samples = [TrainSample([pad_id, pad_id], 1, [0], [0.0], 0.0)]
    rows = shared_prompt_rows(samples) if pack else [[i] for i in range(len(samples))]
    carried = [max(samples[row[0]].response_start - 1, 0) if carry_prompts else 0 for row in rows]
    layouts = [_row_layout([samples[i] for i in row], c) for row, c in zip(rows, carried, strict=True)]
    length = max(len(ids) for ids, _, _, _ in layouts)
    width = max(len(s.input_ids) - s.response_start for s in samples)
    n, r = len(samples), len(rows)
    ids = torch.full((r, length), pad_id, dtype=torch.long)
    positions = torch.zeros((r, length), dtype=torch.long)
    segments = torch.full((r, length), -1, dtype=torch.long)  # -1 padding, 0 shared prompt, j+1 sample j
    predictors = torch.zeros((n, width), dtype=torch.long)
    targets = torch.zeros((n, width), dtype=torch.long)
    mask, rollout, advantages = (torch.zeros((n, width)) for _ in range(3))
    for r_index, (row, (row_ids, row_positions, row_segments, starts)) in enumerate(zip(rows, layouts, strict=True)):
        ids[r_index, :len(row_ids)] = torch.tensor(row_ids)
        positions[r_index, :len(row_ids)] = torch.tensor(row_positions)
        segments[r_index, :len(row_ids)] = torch.tensor(row_segments)
        for i, (predictor_positions, response) in zip(row, starts, strict=True):
            s = samples[i]
            k = len(response)
            predictors[i, :k] = torch.tensor(predictor_positions) + r_index * length
            targets[i, :k] = torch.tensor(response)
            mask[i, :len(s.loss_mask)] = torch.tensor(s.loss_mask, dtype=torch.float)
            rollout[i, :len(s.loss_mask)] = torch.tensor(s.rollout_logprobs[:len(s.loss_mask)], dtype=torch.float)
            advantages[i] = s.advantage
    shared = carry_prompts or any(len(row) > 1 for row in rows)
    attention = _packed_mask(segments) if shared else (segments >= 0).long()
    return MicroBatch(ids, positions, attention, predictors, targets, mask, rollout, advantages,
                      _shared_prompt_attention(segments, carried) if shared else None,
                      [tuple(samples[row[0]].input_ids[:c]) for row, c in zip(rows, carried, strict=True)]
                      if carry_prompts else None)


def _row_layout(samples: Sequence[TrainSample], carried: int = 0) -> tuple[list[int], list[int], list[int], list[tuple[list[int], list[int]]]]:
    """One row: the shared prompt (but its first ``carried`` tokens), then each sample's response. Returns
    the row's ids, position ids, segment ids, and per sample the row positions that predict its response
    tokens and those tokens."""
    prompt_len = samples[0].response_start
    ids, positions = list(samples[0].input_ids[carried:prompt_len]), list(range(carried, prompt_len))
    segments = [0] * len(ids)
    per_sample = []
    for j, s in enumerate(samples):
        response = list(s.input_ids[prompt_len:])
        start = len(ids)
        # the first response token is predicted by the prompt's last position, the others by their predecessor
        predictor_positions = [prompt_len - carried - 1] + list(range(start, start + len(response) - 1))
        ids += response
        positions += range(prompt_len, prompt_len + len(response))
        segments += [j + 1] * len(response)
        per_sample.append((predictor_positions, response))
    return ids, positions, segments, per_sample


def _packed_mask(segments: torch.Tensor) -> torch.Tensor:
    """``[r, 1, L, L]``: query q may attend key k <= q in the shared prompt or in its own sample;
    padding queries attend only themselves (a row with no key would give NaN)."""
    length = segments.shape[1]
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    query, key = segments[:, :, None], segments[:, None, :]
    allowed = causal & (key >= 0) & ((key == 0) | (key == query))
    allowed |= torch.eye(length, dtype=torch.bool)
    return allowed[:, None]


def _shared_prompt_attention(segments: torch.Tensor, carried: Sequence[int]) -> SharedPromptAttention:
    """The blocks of :class:`SharedPromptAttention` for rows with ``segments`` (as in :func:`_packed_mask`)
    whose prompts have their first ``carried[row]`` tokens carried outside the row."""
    rows, length = segments.shape
    first = int(((segments == 0) | (segments == 1)).sum(-1).max())
    output = torch.arange(rows * length).view(rows, length)
    output = torch.where(output % length < first, output // length * first + output % length, 0).flatten()
    width = max(carried)
    span = width + length  # key positions of a row: its carried prompt's slots, then its own
    queries, keys, query_order, key_order = [], [], [], []
    for row in range(rows):
        segment = segments[row]
        prefix = torch.arange(carried[row]) + row * span
        prompt = (segment == 0).nonzero().flatten()
        for j in range(1, int(segment.max())):
            own = (segment == j + 1).nonzero().flatten()
            queries.append(own + row * length)
            keys.append(torch.cat([prefix, torch.cat([prompt, own]) + row * span + width]))
            # row order: carried keys come before every position of the row
            query_order.append(own)
            key_order.append(torch.cat([torch.full((carried[row],), -1), prompt, own]))
    # padding: a query slot sees every real key of its block (no empty softmax), a key slot is seen by none
    pad = functools.partial(torch.nn.utils.rnn.pad_sequence, batch_first=True)
    query_at, key_at = pad(queries or [torch.zeros(0, dtype=torch.long)]), pad(keys or [torch.zeros(0, dtype=torch.long)])
    order = pad(query_order or [torch.zeros(0, dtype=torch.long)], padding_value=length)
    seen = pad(key_order or [torch.zeros(0, dtype=torch.long)], padding_value=length + 1)
    real = order < length
    output[query_at[real]] = rows * first + real.flatten().nonzero().flatten()
    first_mask = None
    if width:
        visible = torch.arange(width)[None, :] < torch.tensor(carried)[:, None]  # [r, C]
        causal = torch.ones(first, first, dtype=torch.bool).tril()
        first_mask = torch.cat([visible[:, None, :].expand(rows, first, width),
                                causal.expand(rows, first, first)], dim=-1)[:, None]
    return SharedPromptAttention(first, query_at, key_at, (seen[:, None, :] <= order[:, :, None])[:, None], output,
                                 width, first_mask)


def _shared_prompt_sdpa(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                        attention_mask: torch.Tensor | None, *args: Any,
                        shared_prompt: SharedPromptAttention | None = None,
                        carried_prompts: CarriedPrompts | None = None,
                        record: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
                        **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' ``sdpa`` attention, or with ``shared_prompt`` the same attention over its blocks only
    (reading each layer's ``carried_prompts`` keys and values first where the rows carry them).
    ``record`` collects each layer's keys and values (a prompt run by :mod:`~skyrl_trainers.prompt_cache`).
    Blocks and carried prompts attend through :func:`_block_attention`.

    ``query`` is ``[r, heads, L, d]`` (``key`` and ``value`` may have fewer heads); returns ``[r, L, heads, d]``.
    """
    if record is not None:
        record.append((key, value))
    options = {"dropout_p": kwargs.get("dropout", 0.0), "scale": kwargs.get("scaling")}
    if shared_prompt is None and record is not None:  # a carried prompt on its own: causal, unpadded
        return _block_attention(query, key, value, None, **options).transpose(1, 2).contiguous(), None
    if shared_prompt is None:
        return _SDPA[0](module, query, key, value, attention_mask, *args, **kwargs)
    rows, heads, length, dim = query.shape
    first = shared_prompt.first
    if carried_prompts is not None:
        carried_keys, carried_values = carried_prompts[module.layer_idx]
        key, value = torch.cat([carried_keys, key], dim=2), torch.cat([carried_values, value], dim=2)
    # right padding after a row's first sample is harmless here: causal queries never see later keys
    first_keys = shared_prompt.carried + first
    first_out = _block_attention(query[:, :, :first], key[:, :, :first_keys], value[:, :, :first_keys],
                                 shared_prompt.first_mask, **options)
    parts = [first_out]

    def blocks(states: torch.Tensor, index: torch.Tensor) -> torch.Tensor:  # [r, h, S, d] -> [B, h, n, d]
        return states.transpose(1, 2).reshape(rows * states.shape[2], states.shape[1], dim)[index].transpose(1, 2)

    if shared_prompt.queries.numel():
        parts.append(_block_attention(blocks(query, shared_prompt.queries), blocks(key, shared_prompt.keys),
                                      blocks(value, shared_prompt.keys), shared_prompt.mask, **options))
    out = torch.cat([part.transpose(1, 2).reshape(-1, heads, dim) for part in parts])
    return out[shared_prompt.output].view(rows, length, heads, dim), None


# Most scores of one attention call that :func:`_bf16_cpu_attention` keeps for backward (8 MiB in bf16, five
# times the main job's largest block); a longer row's attention keeps flash's memory, linear in its length.
MATMUL_ATTENTION_MAX_SCORES = 1 << 22


def _block_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None, *,
                     dropout_p: float = 0.0, scale: float | None = None) -> torch.Tensor:
    """Attention of ``[b, h, q, d]`` queries over ``[b, g, k, d]`` keys and values (``g`` divides ``h``) under
    a boolean ``[b, 1, q, k]`` mask (True: may attend; ``None``: causal, ``q == k``): :func:`_bf16_cpu_attention`
    where autograd runs it on CPU in bf16 over at most ``MATMUL_ATTENTION_MAX_SCORES`` scores, else
    :func:`torch.nn.functional.scaled_dot_product_attention`."""
    bf16 = query.dtype == torch.bfloat16 or (torch.is_autocast_enabled("cpu")
                                             and torch.get_autocast_dtype("cpu") == torch.bfloat16)
    scores = query.shape[0] * query.shape[1] * query.shape[2] * key.shape[2]
    if (query.device.type == "cpu" and bf16 and torch.is_grad_enabled() and not dropout_p
            and scores <= MATMUL_ATTENTION_MAX_SCORES):
        return _bf16_cpu_attention(query, key, value, mask, scale)
    return torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=dropout_p,
                                                            is_causal=mask is None, scale=scale,
                                                            enable_gqa=key.shape[1] != query.shape[1])


def _bf16_cpu_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None,
                        scale: float | None) -> torch.Tensor:
    """Softmax attention as two bf16 matmuls that autograd differentiates, keeping the bf16 probabilities
    (2 bytes a score) for backward.

    The CPU flash kernel's backward recomputes them block by block instead; in bf16 its forward and
    backward together took about twice as long as this on the main job's shapes (and fp32 flash was the
    faster one, so fp32 keeps it). Scores are matmul outputs rounded to bf16 and the softmax accumulates
    in float32, as the kernel's inputs are under autocast; masked scores take bf16's lowest value rather
    than ``-inf``, so a query with no visible key gets an even average instead of NaN.
    """
    batch, heads, length, dim = query.shape
    groups, keys = key.shape[1], key.shape[2]
    if mask is None:
        mask = torch.ones(length, keys, dtype=torch.bool, device=query.device).tril()
    with torch.autocast("cpu", enabled=False):
        # the query heads that share a key head form one matrix: [b, g, (h / g) * q, d]
        grouped = (query.to(torch.bfloat16) * (dim ** -0.5 if scale is None else scale)).reshape(
            batch, groups, heads // groups * length, dim)
        scores = torch.matmul(grouped, key.to(torch.bfloat16).transpose(-1, -2))
        scores = scores.view(batch, groups, heads // groups, length, keys)
        hidden = ~(mask[:, :, None] if mask.dim() == 4 else mask)  # [b, 1, q, k] -> [b, 1, 1, q, k]
        probs = torch.softmax(scores.masked_fill_(hidden, torch.finfo(torch.bfloat16).min), dim=-1)
        out = torch.matmul(probs.view(batch, groups, -1, keys), value.to(torch.bfloat16))
    return out.view(batch, heads, length, dim)


_SDPA: list[Any] = []  # transformers' own sdpa attention, once wrapped by _shared_prompt_sdpa


def install_shared_prompt_sdpa() -> None:
    """Route transformers' ``sdpa`` attention through :func:`_shared_prompt_sdpa` (unchanged without its argument)."""
    if _SDPA:
        return
    from transformers import AttentionInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    _SDPA.append(ALL_ATTENTION_FUNCTIONS["sdpa"])
    AttentionInterface.register("sdpa", _shared_prompt_sdpa)


# Model types whose causal-LM forward is exactly ``logits = lm_head(hidden[:, slice])`` (no logit
# scaling or soft-capping after the head), so log-probs can be computed from the head's input.
CHUNKABLE_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3"})
CHUNK_ROWS = 256  # tokens per chunk: 256 x 49152 fp32 logits is 48 MiB


def token_logprobs(model: torch.nn.Module, batch: MicroBatch, *, temperature: float = 1.0,
                   entropy_grad: bool = False, trained_only: bool = False,
                   carried: CarriedPrompts | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``[n, W]`` log-probs of ``batch.targets`` under ``model`` (logits / temperature) and the entropy of
    each predictive distribution (differentiable only with ``entropy_grad``). A batch whose rows carry
    their prompts needs ``carried``, those prompts' keys and values under ``model``.

    With ``trained_only`` both are computed only where ``batch.mask`` is set and are zero elsewhere: the
    head costs the same for every position it scores, and most response positions of a multi-turn
    episode are observations, which nothing trains on (in the main job, about three in four).

    For a plain bias-free ``nn.Linear`` head of a known model type (see ``CHUNKABLE_MODEL_TYPES``) the
    vocabulary-sized logits are never held for the whole micro-batch: hooks on the head take its input
    inside the model's own forward (so an FSDP2 root sees its parameters used while unsharded and
    registers its backward hooks on the result) and :class:`ChunkedLogProbs` computes log-probs and
    entropy a chunk of predicting positions at a time. Other heads (biases, scaled or soft-capped
    logits) take the plain full-logits path.
    """
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    config = getattr(model, "config", None)
    predictors, targets = batch.predictors.reshape(-1), batch.targets.reshape(-1)
    scored = batch.mask.reshape(-1).nonzero().squeeze(1) if trained_only else None
    if scored is not None:
        predictors, targets = predictors[scored], targets[scored]
    if (type(head) is not torch.nn.Linear or head.bias is not None
            or getattr(config, "model_type", None) not in CHUNKABLE_MODEL_TYPES):
        logp, entropy = _full_logits_logprobs(model, batch, predictors, targets, temperature, entropy_grad, carried)
        return _spread(logp, scored, batch.targets.shape), _spread(entropy, scored, batch.targets.shape)
    differentiable = entropy_grad and torch.is_grad_enabled()

    def take_input(module: torch.nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        hidden.append(args[0])
        return (args[0][:, :0],)  # the head itself computes no logits

    def replace_output(module: torch.nn.Module, args: tuple[Any, ...], output: torch.Tensor) -> torch.Tensor:
        h = _predicting(hidden.pop(), predictors)
        if torch.is_autocast_enabled(h.device.type):  # the head would run in autocast's dtype, not the fp32 residual's
            h = h.to(torch.get_autocast_dtype(h.device.type))
        logp, entropy = ChunkedLogProbs.apply(h, module.weight, targets, temperature, differentiable, CHUNK_ROWS)
        # a fresh tensor, not a view: FSDP2 hooks its backward onto the root's output
        return torch.stack([logp, entropy], dim=-1)

    hidden: list[torch.Tensor] = []
    hooks = [head.register_forward_pre_hook(take_input), head.register_forward_hook(replace_output)]
    try:
        out = _run(model, batch, carried).logits
    finally:
        for hook in hooks:
            hook.remove()
    entropy = out[..., 1] if differentiable else out[..., 1].detach()
    return _spread(out[..., 0], scored, batch.targets.shape), _spread(entropy, scored, batch.targets.shape)


def _spread(values: torch.Tensor, scored: torch.Tensor | None, shape: torch.Size) -> torch.Tensor:
    """``[n, W]`` from the values at the flat positions ``scored`` (zero elsewhere), or of every position."""
    if scored is None:
        return values.view(shape)
    return values.new_zeros(shape.numel()).index_copy(0, scored, values).view(shape)


def _run(model: torch.nn.Module, batch: MicroBatch, carried: CarriedPrompts | None = None) -> Any:
    extra: dict[str, Any] = {}
    if batch.shared_prompt is not None:  # sdpa models attend by blocks, eager ones by the 4D mask
        install_shared_prompt_sdpa()
        extra["shared_prompt"] = batch.shared_prompt
    if batch.shared_prompt is not None and batch.shared_prompt.carried:
        if carried is None:
            raise ValueError("this micro-batch's rows carry their prompts: pass the prompts' keys and values")
        attention = getattr(getattr(model, "config", None), "_attn_implementation", None)
        if attention != "sdpa":  # only the sdpa wrapper reads the carried keys; another would silently skip them
            raise ValueError(f"rows that carry their prompts need sdpa attention, not {attention!r}")
        extra["carried_prompts"] = carried
    return model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids,
                 logits_to_keep=0, use_cache=False, **extra)


def _predicting(per_position: torch.Tensor, predictors: torch.Tensor) -> torch.Tensor:
    """The rows of ``[r, L, ...]`` at the flat ``predictors`` (``[k]``): ``[k, ...]``."""
    return per_position.reshape(-1, *per_position.shape[2:]).index_select(0, predictors)


def _full_logits_logprobs(model: torch.nn.Module, batch: MicroBatch, predictors: torch.Tensor, targets: torch.Tensor,
                          temperature: float, entropy_grad: bool,
                          carried: CarriedPrompts | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Flat ``[k]`` log-probs of ``targets`` and entropies at the flat ``predictors``, from the model's own logits."""
    logits = _predicting(_run(model, batch, carried).logits, predictors).float()
    if temperature != 1.0:
        logits = logits / temperature
    log_probs = torch.log_softmax(logits, dim=-1)
    logp = log_probs.gather(-1, targets[:, None]).squeeze(-1)
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        entropy = -(log_probs.exp() * log_probs).sum(-1)
    return logp, entropy


class ChunkedLogProbs(torch.autograd.Function):
    """``(logp, entropy)`` of ``targets`` under ``softmax(hidden @ weight.T / temperature)``, in row chunks.

    Saves only ``hidden`` and the weight in ``hidden``'s dtype; backward recomputes each chunk's logits.
    With ``z`` the scaled logits and ``p`` their softmax: d logp / dz = onehot - p and d H / dz = -p
    (log p + H). Logits are taken in the inputs' dtype (as the head would), then softmaxed in float32.
    With low-precision inputs (autocast) the weight is cast once, in forward, and kept for backward (a
    fresh vocabulary-sized tensor is mostly page faults: about 28 ms for SmolLM2's head, against 6 ms
    into memory already mapped); each chunk's weight gradient is a low-precision matmul summed in
    float32, as autocast treats every other linear layer.
    """

    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, temperature: float,
                entropy_grad: bool, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
        head = weight.to(hidden.dtype)  # cast once, not per chunk, and kept for backward
        ctx.save_for_backward(hidden, head, targets)
        ctx.temperature, ctx.entropy_grad, ctx.chunk, ctx.weight_dtype = temperature, entropy_grad, chunk, weight.dtype
        logp = hidden.new_empty(hidden.shape[0], dtype=torch.float32)
        entropy = torch.empty_like(logp)
        with torch.autocast(hidden.device.type, enabled=False):
            for start in range(0, hidden.shape[0], chunk):
                rows = slice(start, start + chunk)
                log_p = _chunk_log_softmax(hidden[rows], head, temperature)
                logp[rows] = log_p.gather(-1, targets[rows, None]).squeeze(-1)
                entropy[rows] = -log_p.exp().mul_(log_p).sum(-1)
        if not entropy_grad:
            ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    def backward(ctx: Any, grad_logp: torch.Tensor, grad_entropy: torch.Tensor | None) -> tuple[Any, ...]:
        hidden, head, targets = ctx.saved_tensors
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_weight: torch.Tensor | None = None  # float32, from the first chunk's product (no zeroed buffer)
        with torch.autocast(hidden.device.type, enabled=False):
            for start in range(0, hidden.shape[0], ctx.chunk):
                rows = slice(start, start + ctx.chunk)
                # in place where it can be: each [chunk, vocab] float32 tensor is 48 MiB for SmolLM2, and this runs while
                # every activation of the micro-batch is still alive (the peak of a step's memory)
                log_p = _chunk_log_softmax(hidden[rows], head, ctx.temperature)
                grad_z = log_p.exp()  # p, until it becomes the gradient
                if ctx.entropy_grad and grad_entropy is not None:
                    h = -(grad_z * log_p).sum(-1, keepdim=True)
                    entropy_term = log_p.add_(h).mul_(grad_z).mul_(grad_entropy[rows, None])  # p (log p + H) dH
                else:
                    entropy_term = None
                del log_p
                grad_z.mul_(-grad_logp[rows, None])
                grad_z.scatter_add_(-1, targets[rows, None], grad_logp[rows, None])
                if entropy_term is not None:
                    grad_z.sub_(entropy_term)
                    del entropy_term
                if ctx.temperature != 1.0:
                    grad_z.div_(ctx.temperature)
                grad_z = grad_z.to(hidden.dtype)
                if grad_hidden is not None:
                    grad_hidden[rows] = grad_z @ head
                if not ctx.needs_input_grad[1]:
                    continue
                if grad_weight is None:  # a low-precision matmul (float32 accumulation inside), as autocast does
                    grad_weight = (grad_z.T @ hidden[rows]).float()
                elif hidden.dtype == torch.float32:
                    grad_weight.addmm_(grad_z.T, hidden[rows])
                else:
                    grad_weight += grad_z.T @ hidden[rows]
        return (grad_hidden, None if grad_weight is None else grad_weight.to(ctx.weight_dtype),
                None, None, None, None)


def _chunk_log_softmax(hidden: torch.Tensor, head: torch.Tensor, temperature: float) -> torch.Tensor:
    """Float32 log-softmax of ``hidden @ head.T / temperature`` (``head`` already in ``hidden``'s dtype)."""
    logits = (hidden @ head.T).float()
    if temperature != 1.0:
        logits.div_(temperature)  # a fresh tensor either way: the matmul's result or its float32 copy
    return torch.log_softmax(logits, dim=-1)
