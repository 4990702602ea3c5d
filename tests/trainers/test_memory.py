"""Memory savers give the same numbers: chunked log-probs, and an engine sharing the trainer's weights."""

import pytest
import torch
from skyrl_trainers import forward
from skyrl_trainers.batching import TrainSample
from skyrl_trainers.forward import collate, token_logprobs
from skyrl_trainers.models import build_tiny_random


def batch():
    generator = torch.Generator().manual_seed(1)
    samples = []
    for prompt, response in [(5, 7), (3, 4), (8, 9)]:
        ids = torch.randint(10, 500, (prompt + response,), generator=generator).tolist()
        samples.append(TrainSample(ids, prompt, [1] * response, [0.0] * response, 1.0))
    return collate(samples)


def outputs_and_grads(model, chunked, entropy_grad, monkeypatch, temperature=0.7):
    if not chunked:
        monkeypatch.setattr(forward, "CHUNKABLE_MODEL_TYPES", frozenset())
    monkeypatch.setattr(forward, "CHUNK_ROWS", 5)  # several chunks, the last one partial
    model.zero_grad(set_to_none=True)
    logp, entropy = token_logprobs(model, batch(), temperature=temperature, entropy_grad=entropy_grad)
    weights = torch.linspace(-1, 1, logp.numel()).view_as(logp)
    loss = (logp * weights).sum() + ((entropy * weights.flip(-1)).sum() if entropy_grad else 0)
    loss.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return logp.detach(), entropy.detach(), entropy.requires_grad, grads


@pytest.mark.parametrize("entropy_grad", [False, True])
def test_chunked_logprobs_entropy_and_gradients_equal_the_full_logits(entropy_grad, monkeypatch):
    model, _ = build_tiny_random()
    model.train()
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight  # tied
    with monkeypatch.context() as patch:
        plain = outputs_and_grads(model, False, entropy_grad, patch)
    with monkeypatch.context() as patch:
        chunked = outputs_and_grads(model, True, entropy_grad, patch)
    torch.testing.assert_close(chunked[0], plain[0], rtol=0, atol=1e-5)
    torch.testing.assert_close(chunked[1], plain[1], rtol=0, atol=1e-5)
    assert chunked[2] == plain[2] == entropy_grad
    assert chunked[3].keys() == plain[3].keys() and len(plain[3]) == len(list(model.parameters()))
    for name, grad in plain[3].items():
        # float32 sums in another order: within 1e-5 relative to the largest entry (entropy grads reach ~30)
        torch.testing.assert_close(chunked[3][name], grad, rtol=1e-5, atol=1e-5 * max(1.0, float(grad.abs().max())),
                                   msg=name)


@pytest.mark.parametrize("chunked", [True, False])
def test_trained_only_scores_the_trained_positions_alone_with_the_same_values_and_gradients(chunked, monkeypatch):
    model, _ = build_tiny_random()
    model.train()
    if not chunked:
        monkeypatch.setattr(forward, "CHUNKABLE_MODEL_TYPES", frozenset())
    micro = batch()
    micro.mask[:, 1::3] = 0  # observation tokens inside the responses, besides the padding
    scored = []
    monkeypatch.setattr(forward, "_predicting", lambda h, p, inner=forward._predicting: scored.append(len(p)) or inner(h, p))

    def run(trained_only):
        model.zero_grad(set_to_none=True)
        logp, entropy = token_logprobs(model, micro, temperature=0.7, entropy_grad=True, trained_only=trained_only)
        ((logp + 0.1 * entropy) * micro.mask * torch.linspace(-1, 1, logp.numel()).view_as(logp)).sum().backward()
        return logp.detach(), entropy.detach(), [p.grad.clone() for p in model.parameters()]

    every, only = run(False), run(True)
    trained = micro.mask.bool()
    assert scored == [micro.targets.numel(), int(trained.sum())]  # the head ran on the trained positions only
    for full, part in zip(every[:2], only[:2], strict=True):
        torch.testing.assert_close(part[trained], full[trained], rtol=0, atol=1e-6)
        assert not part[~trained].any()  # zero where nothing is trained
    for full, part in zip(every[2], only[2], strict=True):
        torch.testing.assert_close(part, full, rtol=1e-5, atol=1e-6)


def test_chunked_logprobs_never_hold_a_vocabulary_row_per_token(monkeypatch):
    """The head sees no rows: logits exist only inside the chunked function."""
    model, _ = build_tiny_random()
    seen = []
    model.get_output_embeddings().register_forward_hook(lambda m, a, out: seen.append(a[0].shape[1]))
    with torch.no_grad():
        token_logprobs(model, batch())
    assert seen == [0]


def test_an_engine_sharing_the_trainer_weights_generates_with_each_update_and_holds_no_copy():
    import asyncio

    from skyrl_core.engine import SamplingParams
    from skyrl_trainers.batching import plan_step
    from skyrl_trainers.config import FSDPGRPOConfig
    from skyrl_trainers.engine_setup import shared_engine
    from skyrl_trainers.engines.hf import HFEngine, HFEngineConfig
    from skyrl_trainers.worker import WorkerSpec
    from skyrl_trainers.workers import LocalWorkerGroup

    group = LocalWorkerGroup(WorkerSpec(FSDPGRPOConfig(model="tiny-random", device="cpu", lr=1e-2), seed=0))
    worker = group.worker
    config = HFEngineConfig(model="tiny-random", device="cpu")
    engine = shared_engine(worker, config)
    loop = asyncio.new_event_loop()
    greedy = SamplingParams(max_tokens=8, temperature=0.0)
    try:
        for name, param in worker.model.named_parameters():  # one copy: the engine reads the rank's own tensors
            assert engine.model.get_parameter(name).data_ptr() == param.data_ptr(), name
        assert engine.model.get_output_embeddings().weight is engine.model.get_input_embeddings().weight
        before = loop.run_until_complete(engine.generate([5, 6, 7, 8], greedy))
        samples = [TrainSample([5, 6, 7, 8, *before.token_ids], 4, [1] * 8, before.logprobs, a) for a in (1.0, -1.0)]
        worker.train_step(plan_step(samples, world_size=1, mini_batches=1, micro_batch_tokens=1000)[0])
        loop.run_until_complete(engine.update_weights({}))  # what the trainer calls: no copy, a new weight version
        after = loop.run_until_complete(engine.generate([5, 6, 7, 8], greedy))
        fresh = HFEngine(config)
        loop.run_until_complete(fresh.update_weights(worker.full_state_dict()))
        expected = loop.run_until_complete(fresh.generate([5, 6, 7, 8], greedy))
        fresh.close()
    finally:
        engine.close()
        group.close()
        loop.close()
    assert after.logprobs != before.logprobs  # the update moved the weights the engine uses
    assert after.token_ids == expected.token_ids
    assert after.logprobs == pytest.approx(expected.logprobs, abs=1e-5)
    assert after.metadata["weight_version"] == 1


def test_the_hf_engine_keeps_no_kv_cache_after_a_rollout():
    import asyncio
    import gc

    from skyrl_core.engine import SamplingParams
    from skyrl_trainers.engines.hf import HFEngine, HFEngineConfig
    from transformers import Cache

    engine = HFEngine(HFEngineConfig(model="tiny-random", device="cpu"))
    loop = asyncio.new_event_loop()

    async def rollout():
        params = SamplingParams(max_tokens=6, temperature=1.0)
        return await asyncio.gather(*[engine.generate([5, 6, 7, 8 + i], params.model_copy(update={"seed": i}))
                                      for i in range(6)])

    try:
        outputs = loop.run_until_complete(rollout())
        gc.collect()
        caches = [o for o in gc.get_objects() if issubclass(type(o), Cache)]
    finally:
        engine.close()
        loop.close()
    assert len(outputs) == 6 and caches == []



def test_chunked_logprobs_of_bf16_inputs_stay_close_to_float32():
    """bf16 logits and a weight gradient summed from bf16 chunk products (float32 buffer) stay near float32's."""
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(40, 32, generator=generator)
    weight = (torch.randn(300, 32, generator=generator) * 0.2).requires_grad_()
    targets = torch.randint(0, 300, (40,), generator=generator)
    results = []
    for dtype in (torch.float32, torch.bfloat16):
        h = hidden.to(dtype).requires_grad_()
        logp, entropy = forward.ChunkedLogProbs.apply(h, weight, targets, 0.7, True, 16)
        grad_weight, grad_hidden = torch.autograd.grad((logp + 0.1 * entropy).sum(), (weight, h))
        results.append((logp, grad_weight, grad_hidden.float()))
    assert results[1][1].dtype == torch.float32
    for low, plain in zip(results[1], results[0], strict=True):
        assert float((low - plain).norm() / plain.norm()) < 2e-2


def test_chunked_logprobs_under_autocast_take_the_heads_autocast_dtype(monkeypatch):
    """Under bf16 autocast the chunked head computes bf16 logits, as the plain head would."""
    model, _ = build_tiny_random()
    results = []
    for chunked in (False, True):
        with monkeypatch.context() as patch, torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            if not chunked:
                patch.setattr(forward, "CHUNKABLE_MODEL_TYPES", frozenset())
            results.append(token_logprobs(model, batch())[0])
    torch.testing.assert_close(results[1], results[0], rtol=0, atol=1e-5)



PRIMITIVES_PROGRAM = """
import os
import torch
from skyrl_trainers.memory import bound_onednn_primitive_cache

bound_onednn_primitive_cache(2)  # after torch's import, before the first matmul: as a run does
print("ideep cache:", os.environ["LRU_CACHE_CAPACITY"])
weight = torch.randn(64, 32)
for rows in (5, 6, 7, 5):  # three shapes, then the first again
    with torch.autocast("cpu", dtype=torch.bfloat16):
        torch.nn.functional.linear(torch.randn(rows, 32), weight)
"""


@pytest.mark.parametrize("user_setting", [None, "1024"])
def test_the_onednn_primitive_cache_is_bounded_unless_the_user_set_it(user_setting):
    """Each new matmul shape caches a primitive (a few MB each); a run keeps a few dozen, not oneDNN's 1024."""
    import os
    import re
    import subprocess
    import sys

    caches = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")  # oneDNN's and torch's wrapper's (ideep)
    env = {key: value for key, value in os.environ.items() if key not in caches}
    env["ONEDNN_VERBOSE"] = "all"  # oneDNN reports each primitive it creates as a cache hit or miss
    if user_setting:
        env.update(dict.fromkeys(caches, user_setting))
    done = subprocess.run([sys.executable, "-c", PRIMITIVES_PROGRAM], capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"ideep cache: {user_setting or 2}" in done.stdout
    created = re.findall(r"create:cache_(hit|miss)", done.stdout + done.stderr)
    if not created:
        pytest.skip("this CPU runs bf16 matmuls without oneDNN")
    # bounded to 2: the first shape was evicted and is built again; the user's 1024 keeps it
    assert created == ["miss", "miss", "miss", "hit" if user_setting else "miss"]


THRESHOLD_PROGRAM = """
import ctypes
import sys

import torch
from skyrl_trainers.memory import fix_malloc_thresholds


class MallInfo(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]


libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo
print("fixed:", fix_malloc_thresholds() if sys.argv[1] == "fix" else "not called")
rollout_buffer = torch.ones(16 * 2**20, dtype=torch.uint8)  # mapped under any rule; freed, glibc's rule rises to 16 MiB
del rollout_buffer
before = libc.mallinfo2().hblkhd
cache = torch.ones(8 * 2**20, dtype=torch.uint8)
print("8 MiB mapped:", libc.mallinfo2().hblkhd - before >= 8 * 2**20)
del cache
print("8 MiB returned:", libc.mallinfo2().hblkhd == before)
activation = torch.ones(2 * 2**20, dtype=torch.uint8)
print("2 MiB mapped:", libc.mallinfo2().hblkhd > before)
"""


def run_threshold_program(mode: str, tunables: str | None = None) -> str:
    import os
    import subprocess
    import sys

    env = {key: value for key, value in os.environ.items()
           if key not in ("GLIBC_TUNABLES", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")}
    if tunables:
        env["GLIBC_TUNABLES"] = tunables
    done = subprocess.run([sys.executable, "-c", THRESHOLD_PROGRAM, mode], capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def glibc_with_mallinfo2() -> bool:
    import ctypes

    try:
        return hasattr(ctypes.CDLL("libc.so.6"), "mallinfo2")
    except OSError:
        return False


@pytest.mark.skipif(not glibc_with_mallinfo2(), reason="needs glibc 2.33 or newer (mallinfo2)")
def test_the_rollouts_large_buffers_are_mapped_and_returned_while_activations_stay_in_the_heap():
    """Under glibc's own rule, freeing one large buffer sends every smaller one to the heap, where it
    leaves a resident hole; a run fixes the threshold at 4 MiB."""
    plain = run_threshold_program("plain")
    assert "8 MiB mapped: False" in plain  # the premise: glibc raised its threshold past 8 MiB
    fixed = run_threshold_program("fix")
    assert "fixed: True" in fixed
    assert "8 MiB mapped: True" in fixed and "8 MiB returned: True" in fixed
    assert "2 MiB mapped: False" in fixed  # a micro-batch's activations still reuse the heap


@pytest.mark.skipif(not glibc_with_mallinfo2(), reason="needs glibc 2.33 or newer (mallinfo2)")
def test_malloc_thresholds_the_user_tuned_are_left_alone():
    tuned = run_threshold_program("fix", tunables="glibc.malloc.mmap_threshold=1048576")
    assert "fixed: False" in tuned
    assert "8 MiB mapped: True" in tuned and "2 MiB mapped: True" in tuned  # the user's 1 MiB rules
