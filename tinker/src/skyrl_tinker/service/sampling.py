"""Sampling (:mod:`skyrl_tinker.routes.sampling`): sampling sessions on the base model's, a checkpoint's or a
training model's weights, and samples checked here, then queued on the sampler as a
:class:`~skyrl_tinker.futures.Future`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError
from skyrl_core.engine import SamplingParams
from skyrl_core.http_hygiene import shown, validation_detail

from skyrl_tinker.checkpoints import CheckpointError, TinkerPath
from skyrl_tinker.fields import INT64_MAX, FieldError, Fields, at_most, integers
from skyrl_tinker.futures import Future
from skyrl_tinker.sampler import SampleJob, SamplerWeights
from skyrl_tinker.service.state import RequestError, ServerState, parse_path

MAX_NUM_SAMPLES = 128
DEFAULT_MAX_TOKENS = 256
MAX_TOPK = 64
# Each is checked at every decoding step of every row of a sample: a million of them would stall the sampler,
# which every tenant shares (vLLM sets no limit; OpenAI's API allows 4)
MAX_STOP_SEQUENCES, MAX_STOP_CHARS = 64, 1000
CLONE_SEQ_IDS = 1_000_000_000  # the client numbers a cloned SamplingClient's requests from clone * 1e9
MAX_CLONES = 1024  # clones of one sampling session, each with its own completion log on the server
MAX_TEMPERATURE = 100.0  # far past any useful sampling temperature (the distribution is uniform long before)
UNSUPPORTED_SAMPLE_FIELDS = {"topk_sample_logprobs": "top-k sample logprobs",
                             "target_prompt_logprobs": "target prompt logprobs",
                             "prompt_alt_tokens_k": "prompt alternative tokens"}


class SamplingRequests:
    def __init__(self, state: ServerState) -> None:
        self.state = state

    def create_sampling_session(self, tenant: str, body: Mapping[str, Any]) -> dict[str, Any]:
        fields = Fields(body)
        session = self.state.session(tenant, fields.text("session_id"))
        model_path = fields.text("model_path", None)
        if model_path:
            weights = self._checkpoint_weights(tenant, model_path)
        else:
            self.state.check_base(fields.text("base_model", None))
            weights = self.state.base_weights
        sampling_id = self.state.add_sampling(tenant, session.session_id, weights, model_path)
        return {"type": "create_sampling_session", "sampling_session_id": sampling_id}

    def _checkpoint_weights(self, tenant: str, model_path: str) -> SamplerWeights:
        """A checkpoint's weights, read from disk only when no sampling session or sample holds them."""
        path = parse_path(model_path)
        self.state.readable(tenant, path)
        checkpoints, loaded = self.state.checkpoints, self.state.loaded_weights
        try:
            weights = loaded.get(_weights_key(path, checkpoints.meta(path)))
            if weights is None:
                state, meta, _ = checkpoints.load(path)
                weights = SamplerWeights(_weights_key(path, meta), state, int(meta["lora"]["rank"]))
                weights = loaded.setdefault(weights.key, weights)
        except CheckpointError as exc:
            raise RequestError(404, str(exc)) from None
        return weights

    def sampler_info(self, tenant: str, sampling_id: str) -> dict[str, Any]:
        sampling = self.state.sampling_session(tenant, sampling_id)
        return {"sampler_id": sampling_id, "base_model": self.state.backend.base_model_name,
                "model_path": sampling.model_path}

    def asample(self, tenant: str, body: Mapping[str, Any]) -> tuple[Future, list[str]]:
        fields = Fields(body)
        target = None
        if body.get("sampling_session_id") is not None:
            sampling_id = fields.text("sampling_session_id")
            sampling = self.state.sampling_session(tenant, sampling_id)
            weights, session_id = sampling.weights, sampling.session_id
            seq_id = fields.integer("seq_id", 0, lo=0, hi=MAX_CLONES * CLONE_SEQ_IDS - 1)
            target = (sampling_id, seq_id // CLONE_SEQ_IDS)
        elif body.get("model_path"):  # a one-off sample from a checkpoint, no sampling session
            weights, session_id = self._checkpoint_weights(tenant, fields.text("model_path")), None
        else:
            self.state.check_base(fields.text("base_model", None) or None)
            weights, session_id = self.state.base_weights, None
        for key, feature in UNSUPPORTED_SAMPLE_FIELDS.items():
            if body.get(key):
                raise RequestError(400, f"{feature} ({key}) are not supported by skyrl-tinker")
        prompt = _prompt_tokens(fields.obj("prompt"))
        vocab = self.state.backend.vocab_size
        bad = [t for t in prompt if not 0 <= t < vocab]
        if not prompt or bad:
            raise RequestError(400, "prompt is empty" if not prompt else
                               f"prompt has token ids outside the vocabulary (size {vocab}): {bad[:5]}")
        n = fields.integer("num_samples", 1, lo=1, hi=MAX_NUM_SAMPLES)
        params = _sampling_params(fields.obj("sampling_params"), n, len(prompt), self.state.backend.max_context)
        if params.seed is None and self.state.seeds is not None:
            params = params.model_copy(update={"seed": self.state.seeds.for_sample(tenant, prompt, params, n)})
        last_n = fields.integer("prompt_logprobs_last_n", None, lo=1, hi=len(prompt) - 1)
        topk = fields.integer("topk_prompt_logprobs", 0, lo=0, hi=MAX_TOPK)
        future = self.state.new_future(tenant, "sample", session_id, target)
        if target is not None:
            self.state.used(sampling, future)
        self.state.sampler.submit(SampleJob(future, weights, prompt, n, params, fields.flag("prompt_logprobs"),
                                            last_n, topk))
        return future, [f"{future.request_id}:{i}" for i in range(n)]


def _prompt_tokens(prompt: Fields) -> list[int]:
    tokens: list[int] = []
    for i, raw in enumerate(prompt.items("chunks")):
        chunk = Fields(raw, f"prompt.chunks[{i}]")
        kind = chunk.text("type", "encoded_text")
        if kind != "encoded_text":
            raise RequestError(400, f"prompt chunk type {shown(kind)} is not supported (token chunks only)")
        tokens += integers(chunk.items("tokens"), f"prompt.chunks[{i}].tokens")
    return tokens


def _sampling_params(raw: Fields, num_samples: int, prompt_len: int, max_context: int | None) -> SamplingParams:
    stop = raw.data.get("stop")
    strings: list[str] = []
    ids: list[int] = []
    if isinstance(stop, str):
        strings = [stop]
    elif isinstance(stop, list):
        at_most(stop, MAX_STOP_SEQUENCES, "sampling_params.stop")
        strings = [s for s in stop if isinstance(s, str)]
        ids = integers([s for s in stop if not isinstance(s, str)], "sampling_params.stop")
    elif stop is not None:
        raise FieldError("sampling_params.stop must be a string or a list of strings or token ids")
    if any(len(text) > MAX_STOP_CHARS for text in strings):
        raise FieldError(f"sampling_params.stop strings may have at most {MAX_STOP_CHARS} characters each")
    if max_context is not None and prompt_len >= max_context:
        raise RequestError(400, f"prompt has {prompt_len} tokens, the model's context is {max_context}")
    seed = raw.integer("seed", None)
    if seed is not None and seed + num_samples - 1 > INT64_MAX:
        raise FieldError(f"sampling_params.seed + num_samples - 1 must fit an int64 (sample i uses seed + i), "
                         f"got seed {seed}")
    try:
        return SamplingParams(max_tokens=raw.integer("max_tokens", DEFAULT_MAX_TOKENS, lo=1),
                              temperature=raw.number("temperature", 1.0, lo=0.0, hi=MAX_TEMPERATURE),
                              top_p=raw.number("top_p", 1.0, lo=0.0, hi=1.0, above=True),
                              top_k=raw.integer("top_k", -1), stop=strings, stop_token_ids=ids, seed=seed,
                              ignore_eos=isinstance(stop, list) and not stop)  # Tinker: [] disables EOS too
    except ValidationError as exc:
        raise RequestError(400, f"bad sampling_params: {validation_detail(exc.errors())}") from None


def _weights_key(path: TinkerPath, meta: Mapping[str, Any]) -> str:
    """Names a checkpoint's weights as saved: a checkpoint saved over must not pass for the one the
    engine holds, nor share its loaded copy."""
    return f"{path}@{meta.get('time')}"
