"""GRPO through the Tinker client: sample -> reward -> group-relative advantages -> importance_sampling.

The default task is one ``tiny-random`` can learn in a few dozen steps: every completion is rewarded
by the share of its tokens that contain the letter ``a``. With ``--env ID`` the prompts and rewards
come from one of our environments instead (its built-in dataset; one turn per episode; the reward is
the env's own ``step`` reward), e.g. ``--env reverse_text`` (needs a real model such as
``smollm2-135m`` to learn). Each step the current weights are saved for sampling, ``--group``
completions are drawn per prompt, each completion's advantage is its reward minus its group's mean
(over the group's std), and one ``forward_backward`` with the ``importance_sampling`` loss (sampler
logprobs as the reference) plus one ``optim_step`` follows.

    python tinker/examples/rl_loop.py                      # starts a server in this process
    python tinker/examples/rl_loop.py --base-url http://127.0.0.1:8000   # or use a running one
    python tinker/examples/rl_loop.py --env reverse_text --base-model smollm2-135m
"""

from __future__ import annotations

import statistics

import tinker
from _common import chat_tokens, example_parser, service_client
from tinker import types

PROMPTS = ["Say something:", "Write a word.", "Go on", "Tell me", "Reply:", "Next", "Hello", "Start here"]


class LetterTask:
    """Reward: the share of the completion's tokens whose text contains an ``a``."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.messages = [[{"role": "user", "content": p}] for p in PROMPTS]

    def reward(self, index: int, tokens: list[int]) -> float:
        if not tokens:
            return 0.0
        return sum("a" in self.tokenizer.decode([t]) for t in tokens) / len(tokens)


class EnvTask:
    """Prompts and rewards from a skyrl environment: one episode per completion, one turn."""

    def __init__(self, tokenizer, env_id: str, n_prompts: int = len(PROMPTS)) -> None:
        from skyrl_core.factory import env_class, make_env

        self.tokenizer = tokenizer
        self.env_id = env_id
        self.tasks = list(env_class(env_id).load_dataset("train"))[:n_prompts]
        self.messages = [make_env(env_id, task, {"max_turns": 1}).reset()[0] for task in self.tasks]

    def reward(self, index: int, tokens: list[int]) -> float:
        from skyrl_core.factory import make_env

        env = make_env(self.env_id, self.tasks[index], {"max_turns": 1})
        env.reset()
        return float(env.step(self.tokenizer.decode(tokens, skip_special_tokens=True)).reward)


def train(service: tinker.ServiceClient, base_model: str, steps: int, group: int, max_tokens: int,
          lr: float, seed: int = 0, env: str | None = None) -> list[float]:
    client = service.create_lora_training_client(base_model=base_model, rank=8, seed=seed).result()
    tokenizer = client.get_tokenizer()
    task = EnvTask(tokenizer, env) if env else LetterTask(tokenizer)
    prompts = [chat_tokens(tokenizer, m) for m in task.messages]
    params = types.SamplingParams(max_tokens=max_tokens, temperature=1.0)
    history = []
    for step in range(steps):
        sampler = client.save_weights_and_get_sampling_client().result()
        results = [sampler.sample(types.ModelInput.from_ints(p), group, params) for p in prompts]
        data, rewards = [], []
        for index, (prompt, result) in enumerate(zip(prompts, results, strict=True)):
            sequences = result.result().sequences
            scores = [task.reward(index, list(s.tokens)) for s in sequences]
            rewards += scores
            mean, std = statistics.fmean(scores), statistics.pstdev(scores)
            for seq, score in zip(sequences, scores, strict=True):
                advantage = (score - mean) / (std + 1e-6)
                if not seq.tokens or advantage == 0:
                    continue
                tokens = prompt + list(seq.tokens)
                n_prompt = len(prompt) - 1
                data.append(types.Datum(
                    model_input=types.ModelInput.from_ints(tokens[:-1]),
                    loss_fn_inputs={"target_tokens": tokens[1:],
                                    "logprobs": [0.0] * n_prompt + list(seq.logprobs),
                                    "advantages": [0.0] * n_prompt + [advantage] * len(seq.tokens)}))
        if data:
            client.forward_backward(data, "importance_sampling")
            client.optim_step(types.AdamParams(learning_rate=lr)).result()
        history.append(statistics.fmean(rewards))
        print(f"step {step:3d}  reward {history[-1]:.3f}  datums {len(data)}", flush=True)
    return history


def main() -> None:
    parser = example_parser(__doc__)
    parser.add_argument("--env", help="an installed skyrl env id (e.g. reverse_text); default: the letter task")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-2)
    args = parser.parse_args()
    with service_client(args.base_url, args.base_model) as service:
        history = train(service, args.base_model, args.steps, args.group, args.max_tokens, args.lr, env=args.env)
    first, last = statistics.fmean(history[:5]), statistics.fmean(history[-5:])
    print(f"reward: first 5 steps {first:.3f} -> last 5 steps {last:.3f}")


if __name__ == "__main__":
    main()
