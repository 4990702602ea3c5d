"""skyrl-tinker sampling through the ``vllm`` engine, on CPU: the real ``VLLMEngine`` and the real server and
client, with vLLM's ``AsyncLLM`` replaced by a stand-in that runs a real tiny HF model (vLLM itself needs a
CUDA GPU; nothing here has run against real vLLM).

The stand-in keeps the parts of vLLM's contract the engine relies on: outputs stream as deltas with the
sampled token's raw logprob; a ``prompt_logprobs=k`` request returns ``RequestOutput.prompt_logprobs`` as
vLLM builds it (``None`` for the first token, then ``{token_id: Logprob(logprob, rank, decoded_token)}``
with the prompt token first, at its vocabulary rank, and the k best at ranks 1..k); weights arrive through
``collective_rpc("skyrl_load_weights")`` into our real worker extension, whose ``model.load_weights``
accepts Hugging Face parameter names only (an unknown name fails, as a name vLLM cannot map would).
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import subprocess
import sys
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from skyrl_core.engine import SamplingParams
from skyrl_tinker.app import ServerConfig, build_service
from skyrl_tinker.local import LocalServer
from skyrl_tinker.sampler import vllm_sampler_config
from skyrl_tinker.service.sampling import MAX_TOPK
from skyrl_trainers.engines.hf import HFEngine, HFEngineConfig
from skyrl_trainers.engines.sampling import RowParams, sample_next
from skyrl_trainers.engines.vllm import VLLMEngine, VLLMUnavailableError, read_prompt_logprobs
from skyrl_trainers.engines.vllm_worker import WeightLoaderExtension
from skyrl_trainers.models import load_model_and_tokenizer
from tinker import types
from tinker_helpers import train_a_little

PROMPT = [5, 17, 42, 99, 7, 23]
HAS_VLLM_AND_CUDA = importlib.util.find_spec("vllm") is not None and torch.cuda.is_available()


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class Completion:
    token_ids: list[int]
    logprobs: list[dict[int, Logprob]] | None
    text: str
    finish_reason: str | None


@dataclass
class RequestOutput:
    outputs: list[Completion]
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None


class HFNamedModel:
    """What the worker extension calls on vLLM's model: ``parameters()`` and ``load_weights(weights=...)``."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.loaded: list[str] = []

    def parameters(self):
        return self.model.parameters()

    def load_weights(self, weights):
        params = dict(self.model.named_parameters())
        with torch.no_grad():
            for name, tensor in weights:
                if name not in params:
                    raise KeyError(f"the model has no weight named {name!r}")
                params[name].copy_(tensor)
                self.loaded.append(name)


class Worker(WeightLoaderExtension):
    def __init__(self, model: HFNamedModel) -> None:
        self.model_runner = SimpleNamespace(model=model)


class HFBackedLLM:
    """The parts of ``vllm.v1.engine.async_llm.AsyncLLM`` the engine calls, computed with a real HF model."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model.eval()
        eos = model.generation_config.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
        self.named = HFNamedModel(model)
        self.worker = Worker(self.named)
        self.generated = self.scored = 0
        self.pauses: list[str] = []

    @torch.inference_mode()
    def _logits(self, ids: list[int]) -> torch.Tensor:
        return self.model(input_ids=torch.tensor([ids]), use_cache=False).logits[0].float()

    async def generate(self, prompt: Any, sampling: Any, request_id: str):
        ids = list(prompt["prompt_token_ids"])
        if isinstance(sampling, Scoring):
            self.scored += 1
            yield RequestOutput([Completion([0], None, "", "length")], self._prompt_logprobs(ids, sampling.k))
            return
        self.generated += 1
        generator = torch.Generator().manual_seed(sampling.seed if sampling.seed is not None else 0)
        row = RowParams(sampling.temperature, sampling.top_k, sampling.top_p, generator)
        out: list[int] = []
        for _ in range(sampling.max_tokens):
            await asyncio.sleep(0)  # one engine step
            tokens, logprobs = sample_next(self._logits(ids + out)[-1:], [row], "raw")
            token, logprob = int(tokens[0]), float(logprobs[0])
            out.append(token)
            stop = token in self.eos_ids or token in sampling.stop_token_ids
            finish = "stop" if stop else "length" if len(out) == sampling.max_tokens else None
            yield RequestOutput([Completion([token], [{token: Logprob(logprob, 1)}], f"<{token}>", finish)])
            if finish:
                return

    def _prompt_logprobs(self, ids: list[int], k: int) -> list[dict[int, Logprob] | None]:
        log_probs = torch.log_softmax(self._logits(ids)[:-1], dim=-1)
        scored: list[dict[int, Logprob] | None] = [None]
        for t, row in enumerate(log_probs, start=1):
            token = ids[t]
            entries = {token: Logprob(float(row[token]), int((row > row[token]).sum()) + 1)}
            values, indices = row.topk(k)
            for rank, (value, index) in enumerate(zip(values.tolist(), indices.tolist(), strict=True), start=1):
                entries[index] = Logprob(value, rank)
            scored.append(entries)
        return scored

    async def collective_rpc(self, method: str, timeout: float | None = None, args: tuple = (),
                             kwargs: dict | None = None) -> list[Any]:
        return [getattr(self.worker, method)(*args, **(kwargs or {}))]

    async def pause_generation(self, *, mode: str = "abort", clear_cache: bool = True) -> None:
        self.pauses.append(mode)

    async def resume_generation(self) -> None:
        pass

    async def reset_prefix_cache(self, reset_running_requests: bool = False, reset_connector: bool = False) -> bool:
        return True

    def shutdown(self) -> None:
        pass


@dataclass
class Scoring:
    k: int


class StandInEngine(VLLMEngine):
    """The real engine, building plain request objects instead of vLLM's (whose classes need vllm installed)."""

    def _prompt(self, prompt_ids: list[int]) -> Any:
        return {"prompt_token_ids": prompt_ids}

    def _sampling(self, params: SamplingParams) -> Any:
        return params

    def _scoring(self, num_logprobs: int) -> Any:
        return Scoring(num_logprobs)


def _reference_model() -> torch.nn.Module:
    model, _ = load_model_and_tokenizer("tiny-random")
    return model


def _standin_engine(config: ServerConfig) -> tuple[StandInEngine, HFBackedLLM]:
    llm = HFBackedLLM(_reference_model())
    vllm_config = vllm_sampler_config(config.base_model, gpu_memory_utilization=config.sampler_gpu_memory_utilization,
                                      max_logprobs=MAX_TOPK)
    assert vllm_config.logprobs_mode == "raw" and vllm_config.extra_engine_args["max_logprobs"] == MAX_TOPK
    return StandInEngine(vllm_config, llm=llm), llm


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory, one_thread):
    config = ServerConfig(base_model="tiny-random", checkpoint_dir=str(tmp_path_factory.mktemp("ckpt")),
                          sampler_engine="vllm")
    engine, llm = _standin_engine(config)
    server = LocalServer(config, service=build_service(config, sampler_engine=engine))
    server.llm = llm
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(vllm_server):
    import tinker

    service = tinker.ServiceClient(base_url=vllm_server.url, api_key="tml-skyrl-test")
    yield service
    service.close("success").result()


@torch.inference_mode()
def _logprobs_of(model: torch.nn.Module, tokens: list[int]) -> np.ndarray:
    """log p(tokens[t] | tokens[:t]) for t >= 1, from a separate copy of the model."""
    log_probs = torch.log_softmax(model(input_ids=torch.tensor([tokens]), use_cache=False).logits[0, :-1].float(), -1)
    return log_probs.gather(-1, torch.tensor(tokens[1:])[:, None]).squeeze(-1).numpy()


def test_sampled_logprobs_equal_compute_logprobs_and_the_model(vllm_server, client):
    assert vllm_server.service.sampler.engine.__class__ is StandInEngine
    sampler = client.create_sampling_client(base_model="tiny-random").result()
    reference = _reference_model()
    generated, scored = vllm_server.llm.generated, vllm_server.llm.scored
    params = types.SamplingParams(max_tokens=10, temperature=1.0, seed=7)
    result = sampler.sample(types.ModelInput.from_ints(PROMPT), 3, params).result()
    assert vllm_server.llm.generated == generated + 3  # every sample went through the stand-in vLLM
    assert len({tuple(s.tokens) for s in result.sequences}) > 1
    for seq in result.sequences:
        assert len(seq.tokens) == len(seq.logprobs) and seq.stop_reason in ("stop", "length")
        full = PROMPT + list(seq.tokens)
        computed = sampler.compute_logprobs(types.ModelInput.from_ints(full)).result()
        assert computed[0] is None
        np.testing.assert_allclose(computed[len(PROMPT):], seq.logprobs, atol=1e-4)
        np.testing.assert_allclose(_logprobs_of(reference, full)[len(PROMPT) - 1:], seq.logprobs, atol=1e-4)
    assert vllm_server.llm.scored == scored + 3  # compute_logprobs went through vLLM's prompt logprobs


def test_top_k_prompt_logprobs_through_vllm(client):
    sampler = client.create_sampling_client(base_model="tiny-random").result()
    out = sampler.sample(types.ModelInput.from_ints(PROMPT), 1, types.SamplingParams(max_tokens=1),
                         include_prompt_logprobs=True, topk_prompt_logprobs=5).result()
    assert out.prompt_logprobs[0] is None and out.topk_prompt_logprobs[0] is None
    with torch.inference_mode():
        logits = _reference_model()(input_ids=torch.tensor([PROMPT]), use_cache=False).logits[0, :-1].float()
    values, indices = torch.log_softmax(logits, -1).topk(5, dim=-1)
    np.testing.assert_allclose(out.prompt_logprobs[1:], _logprobs_of(_reference_model(), PROMPT), atol=1e-4)
    for position in range(1, len(PROMPT)):
        row = out.topk_prompt_logprobs[position]
        assert [token for token, _ in row] == indices[position - 1].tolist()
        np.testing.assert_allclose([lp for _, lp in row], values[position - 1].numpy(), atol=1e-4)


def _trainer_logprobs(training_client, tokens: list[int]) -> np.ndarray:
    datum = types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                        loss_fn_inputs={"target_tokens": tokens[1:]})
    out = training_client.forward([datum], "cross_entropy").result()
    return np.asarray(out.loss_fn_outputs[0]["logprobs"].data)


def test_a_lora_sampler_reaches_the_vllm_model_and_changes_what_it_samples(vllm_server, client):
    llm = vllm_server.llm
    base = client.create_sampling_client(base_model="tiny-random").result()
    greedy = types.SamplingParams(max_tokens=8, temperature=0.0)
    before = base.sample(types.ModelInput.from_ints(PROMPT), 1, greedy).result().sequences[0]

    trainer = client.create_lora_training_client(base_model="tiny-random", rank=4, seed=0).result()
    train_a_little(trainer, 4, 2e-2)
    lora = trainer.save_weights_and_get_sampling_client().result()
    loads = len(llm.named.loaded)
    pauses = len(llm.pauses)
    tuned = lora.sample(types.ModelInput.from_ints(PROMPT), 1, greedy).result().sequences[0]
    # the merged weights went through collective_rpc into the model under Hugging Face names
    names = llm.named.loaded[loads:]
    assert names and all(n.startswith("model.layers.") and n.endswith("_proj.weight") for n in names)
    assert llm.pauses[pauses:] == ["wait"]  # the sampler swaps weights only with nothing in flight
    assert list(tuned.tokens) != list(before.tokens) or not np.allclose(tuned.logprobs, before.logprobs, atol=1e-3)
    # what the stand-in sampled under the LoRA weights is what the trainer's base + adapter computes
    np.testing.assert_allclose(_trainer_logprobs(trainer, PROMPT + list(tuned.tokens))[len(PROMPT) - 1:],
                               tuned.logprobs, atol=1e-4)
    shift = np.abs(_logprobs_of(_reference_model(), PROMPT + list(tuned.tokens))[len(PROMPT) - 1:]
                   - np.asarray(tuned.logprobs)).max()
    assert shift > 1e-2  # ... and not what the base model gives
    # back to the base weights: the base sampler samples exactly as before
    again = base.sample(types.ModelInput.from_ints(PROMPT), 1, greedy).result().sequences[0]
    assert list(again.tokens) == list(before.tokens)
    np.testing.assert_allclose(again.logprobs, before.logprobs, atol=1e-5)


def test_hf_and_vllm_engines_score_prompts_alike():
    """The two engines' ``prompt_logprobs`` return the same shapes and values (one model, two engines)."""
    model, tokenizer = load_model_and_tokenizer("tiny-random")
    hf = HFEngine.from_model(model, tokenizer, HFEngineConfig(logprobs_mode="raw", batch_wait_ms=0))
    vllm = StandInEngine(vllm_sampler_config("tiny-random", gpu_memory_utilization=0.4, max_logprobs=MAX_TOPK),
                         llm=HFBackedLLM(_reference_model()))
    try:
        for topk in (0, 3):
            (hf_lp, hf_top), (v_lp, v_top) = (asyncio.run(e.prompt_logprobs(PROMPT, topk)) for e in (hf, vllm))
            assert np.isnan(hf_lp[0]) and np.isnan(v_lp[0]) and len(hf_lp) == len(v_lp) == len(PROMPT)
            np.testing.assert_allclose(hf_lp[1:], v_lp[1:], atol=1e-5)
            if topk:
                assert hf_top[0].shape == v_top[0].shape == (len(PROMPT), topk)
                np.testing.assert_array_equal(hf_top[0], v_top[0])
                np.testing.assert_allclose(hf_top[1], v_top[1], atol=1e-5)
                assert np.all(np.isneginf(v_top[1][0]))
            else:
                assert hf_top is None and v_top is None
    finally:
        hf.close()
        vllm.close()


def test_read_prompt_logprobs_takes_the_top_k_by_logprob_whatever_the_dict_order():
    scored = [None,
              {9: Logprob(-3.0, 4), 1: Logprob(-0.5, 1), 2: Logprob(-1.0, 2)},  # prompt token 9 outside the top 2
              {2: Logprob(-0.2, 1), 4: Logprob(-2.0, 2)}]  # prompt token 2 is the best
    logprobs, (ids, lps) = read_prompt_logprobs([5, 9, 2], scored, 2)
    assert np.isnan(logprobs[0]) and logprobs[1:] == [-3.0, -0.2]
    assert ids.tolist() == [[0, 0], [1, 2], [2, 4]]
    assert np.all(np.isneginf(lps[0])) and np.allclose(lps[1:], [[-0.5, -1.0], [-0.2, -2.0]])
    plain, top = read_prompt_logprobs([5, 9, 2], scored, 0)
    assert plain[1:] == [-3.0, -0.2] and top is None


@pytest.mark.skipif(HAS_VLLM_AND_CUDA, reason="vLLM and a GPU are both present")
def test_without_vllm_or_a_gpu_the_server_refuses_to_start_and_says_why(tmp_path):
    with pytest.raises(VLLMUnavailableError, match="vllm") as err:
        build_service(ServerConfig(base_model="tiny-random", checkpoint_dir=str(tmp_path), sampler_engine="vllm"))
    assert "CUDA" in str(err.value) or "vllm package is not installed" in str(err.value)
    command = [sys.executable, "-c", "from skyrl_tinker.cli import main; main()", "serve", "--sampler-engine", "vllm",
               "--checkpoint-dir", str(tmp_path), "--port", "1"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 1
    assert "the vllm engine cannot start" in done.stderr and "--sampler-engine hf" in done.stderr
    assert "Traceback" not in done.stderr + done.stdout
