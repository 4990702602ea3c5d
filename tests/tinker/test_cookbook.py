"""tinker-cookbook's own training loops run against our server, offline, on tiny-random.

* ``supervised.train.main`` (what the cookbook's ``sl_basic`` recipe runs) on a JSONL conversation
  file through the cookbook's ``FromConversationFileBuilder``, with a held-out conversation scored by
  its ``SamplerNLLEvaluator``; the final sampler checkpoint it records then answers greedily.
* ``rl.train.main`` (what ``rl_basic`` runs) on the cookbook's own toy ``ArithmeticDatasetBuilder``.
* ``recipes/sl_loop.py``'s flat loop, with its Hugging Face dataset replaced by a local one.

Nothing is downloaded: the cookbook looks tokenizers up by model name, so the served model's name is
registered with its ``register_tokenizer`` hook. The renderer is ``qwen3_instruct``: tiny-random's
tokenizer has the same ChatML template. scripts/setup.sh installs tinker-cookbook (see tinker/README.md).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import statistics
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

try:
    import datasets
    import tinker
    from tinker_cookbook import model_info, renderers, tokenizer_utils
    from tinker_cookbook.recipes import sl_loop
    from tinker_cookbook.recipes.math_rl.arithmetic_env import ArithmeticDatasetBuilder
    from tinker_cookbook.rl import train as rl_train
    from tinker_cookbook.supervised import train as sl_train
    from tinker_cookbook.supervised.data import FromConversationFileBuilder
    from tinker_cookbook.supervised.types import ChatDatasetBuilderCommonConfig
except ImportError as exc:
    if os.environ.get("SKYRL_REQUIRE_TINKER") == "1":  # CI: scripts/setup.sh installs it, so this is a failure
        raise RuntimeError(f"SKYRL_REQUIRE_TINKER=1 but tinker-cookbook cannot be imported ({exc}); "
                           "scripts/setup.sh installs it (see tinker/README.md)") from exc
    pytest.skip(f"tinker-cookbook is not importable here ({exc}); scripts/setup.sh installs it",
                allow_module_level=True)

# the cookbook still calls the client's *_async methods and the TrainingClient future, which tinker 0.38 deprecates
pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::FutureWarning")]

MODEL = "tiny-random"
RENDERER = "qwen3_instruct"
QA = [("What is the capital of France?", "Paris."), ("What colour is the sky?", "Blue."),
      ("How many legs does a cat have?", "Four."), ("Say hello.", "Hello!"),
      ("Name a fruit.", "An apple.")]


def _conversation(question: str, answer: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]


def _metrics(log_path: Path) -> list[dict]:
    return [json.loads(line) for line in (log_path / "metrics.jsonl").read_text().splitlines()]


@contextmanager
def cookbook_clients_closed() -> Iterator[list]:
    """The ``ServiceClient``s the cookbook makes inside, closed on the way out.

    The cookbook never closes its client, so its session heartbeat would outlive the server and warn
    about a dead port for the rest of the run; leave this before the server stops.
    """
    made = []

    class Recorded(tinker.ServiceClient):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tinker, "ServiceClient", Recorded)
        try:
            yield made
        finally:
            for client in made:
                client.close("success").result(timeout=60)


def _final_checkpoint(log_path: Path) -> dict:
    records = [json.loads(line) for line in (log_path / "checkpoints.jsonl").read_text().splitlines()]
    return next(r for r in records if r["name"] == "final")


@pytest.fixture(autouse=True)
def _cookbook_offline():
    """The served model's tokenizer under its name, and the root logger as it was afterwards.

    The cookbook's ``ml_log.setup_logging`` replaces the root logger's handlers (pytest's included).
    """
    from skyrl_trainers.models import load_tokenizer

    tokenizer_utils.register_tokenizer(MODEL, lambda: load_tokenizer(MODEL))
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    tokenizer_utils.unregister_tokenizer(MODEL)
    for handler in list(root.handlers):
        if handler not in handlers:
            root.removeHandler(handler)
            handler.close()
    for handler in handlers:
        if handler not in root.handlers:
            root.addHandler(handler)
    root.setLevel(level)


def test_cookbook_sl_train_learns_a_conversation_file(server, service_client, tmp_path):
    data = tmp_path / "conversations.jsonl"
    data.write_text("".join(json.dumps({"messages": _conversation(q, a)}) + "\n" for q, a in QA))
    common = ChatDatasetBuilderCommonConfig(model_name_for_tokenizer=MODEL, renderer_name=RENDERER, max_length=256,
                                            batch_size=4, train_on_what=renderers.TrainOnWhat.LAST_ASSISTANT_MESSAGE)
    # one conversation held out (test/nll), the other four are one batch: one step per epoch
    builder = FromConversationFileBuilder(common_config=common, file_path=str(data), test_size=1)
    log_path = tmp_path / "sl"
    config = sl_train.Config(log_path=str(log_path), model_name=MODEL, recipe_name="skyrl_test_sl",
                             renderer_name=RENDERER, dataset_builder=builder, learning_rate=1e-2,
                             lr_schedule="constant", num_epochs=24, lora_rank=16, base_url=server.url,
                             save_every=10, eval_every=8)
    with cookbook_clients_closed():
        asyncio.run(sl_train.main(config))

    metrics = _metrics(log_path)
    assert [m["step"] for m in metrics] == list(range(24))
    nll = [m["train_mean_nll"] for m in metrics]
    assert all(math.isfinite(x) for x in nll) and nll[-1] < 0.1 * nll[0], nll
    assert all(m["num_sequences"] == 4 for m in metrics)
    evals = [(m["step"], m["test/nll"]) for m in metrics if "test/nll" in m]
    assert [s for s, _ in evals] == [0, 8, 16] and all(math.isfinite(x) for _, x in evals), evals
    names = [json.loads(line)["name"] for line in (log_path / "checkpoints.jsonl").read_text().splitlines()]
    assert names == ["000010", "000020", "final"], names

    # the sampler checkpoint the cookbook recorded answers the training questions
    renderer = renderers.get_renderer(RENDERER, tokenizer_utils.get_tokenizer(MODEL))
    sampler = service_client.create_sampling_client(model_path=_final_checkpoint(log_path)["sampler_path"])
    params = tinker.SamplingParams(max_tokens=16, temperature=0.0, stop=renderer.get_stop_sequences())
    trained = 0
    for question, answer in QA:
        prompt = renderer.build_generation_prompt([{"role": "user", "content": question}])
        tokens = sampler.sample(prompt, 1, params).result().sequences[0].tokens
        message, _ = renderer.parse_response(tokens)
        trained += renderers.get_text_content(message) == answer
    assert trained >= 4, f"{trained} of {len(QA)} answers reproduced (4 were trained)"


def test_cookbook_rl_train_learns_the_format_reward(new_server, tmp_path):
    # fresh and seeded: the run's samples and LoRA init repeat
    with new_server(tmp_path / "checkpoints") as server:
        with cookbook_clients_closed() as made:
            _rl_train_learns_the_format_reward(server, tmp_path)
        assert len(made) == 1 and len(server.service.sessions) == 0  # its session ended before the server


def _rl_train_learns_the_format_reward(server, tmp_path):
    steps = 22
    # 4 addition problems x 8 samples a step; the reward is 1 for the right sum and -0.1 without the
    # stop sequence: tiny-random never adds, but learns to end its turn (<|im_end|>) within max_tokens
    builder = ArithmeticDatasetBuilder(batch_size=4, group_size=8, model_name_for_tokenizer=MODEL,
                                       renderer_name=RENDERER, n_batches=steps)
    log_path = tmp_path / "rl"
    config = rl_train.Config(log_path=str(log_path), model_name=MODEL, recipe_name="skyrl_test_rl",
                             renderer_name=RENDERER, dataset_builder=builder, learning_rate=1e-2,
                             max_tokens=16, lora_rank=16, base_url=server.url, save_every=0, eval_every=0)
    asyncio.run(rl_train.main(config))

    metrics = _metrics(log_path)
    assert [m["step"] for m in metrics] == list(range(steps))
    assert all(m["env/all/total_episodes"] == 32 for m in metrics)
    fmt = [m["env/all/format"] for m in metrics]
    reward = [m["env/all/reward/total"] for m in metrics]
    assert all(math.isfinite(r) and -0.1 - 1e-9 <= r <= 1.0 for r in reward), reward
    assert statistics.fmean(fmt[-3:]) >= 0.7 and statistics.fmean(fmt[-3:]) > statistics.fmean(fmt[:3]) + 0.5, fmt
    assert statistics.fmean(reward[-3:]) > statistics.fmean(reward[:3]), reward
    # the sampler's logprobs are the trainer's: the cookbook's sample/train KL estimate is ~0
    assert all(abs(m["optim/kl_sample_train_v1"]) < 1e-3 for m in metrics), [m["optim/kl_sample_train_v1"] for m in metrics]
    assert _final_checkpoint(log_path)["batch"] == steps


def test_cookbook_minimal_sl_loop(server, tmp_path, monkeypatch):
    # sl_loop.py loads HuggingFaceH4/no_robots from the hub and picks the renderer by model name:
    # give it local rows of the same shape and our renderer
    rows = [{"messages": _conversation(q, a)} for q, a in QA[:4]] * 2
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(rows)}))
    monkeypatch.setattr(model_info, "get_recommended_renderer_name", lambda name: RENDERER)
    log_path = tmp_path / "sl_loop"
    config = sl_loop.Config(base_url=server.url, log_path=str(log_path), model_name=MODEL, batch_size=2,
                            learning_rate=1e-2, max_length=256, lora_rank=16, save_every=2)
    sl_loop.main(config)

    metrics = _metrics(log_path)
    assert [m["step"] for m in metrics] == [0, 1, 2, 3]
    nll = [m["train_mean_nll"] for m in metrics]
    assert all(math.isfinite(x) for x in nll) and nll[-1] < nll[0], nll
    assert _final_checkpoint(log_path)["sampler_path"].startswith("tinker://")
