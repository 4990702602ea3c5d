"""Supervised fine-tuning through the Tinker client: cross_entropy on chat completions, then sample.

Each example is a chat prompt and its answer, rendered with the model's chat template; the loss is
weighted 0 on the prompt and 1 on the answer (Tinker's shifted layout: ``model_input`` is the
sequence without its last token, ``target_tokens`` without its first). The loss falls, and greedy
sampling from the saved weights reproduces the answers.

    python tinker/examples/sl_loop.py                      # starts a server in this process
    python tinker/examples/sl_loop.py --base-url http://127.0.0.1:8000
"""

from __future__ import annotations

import tinker
from _common import chat_tokens, example_parser, service_client
from tinker import types

EXAMPLES = [("What is the capital of France?", "Paris."), ("Reverse 'abc'.", "cba"),
            ("Say hi.", "Hi there!"), ("Two plus two?", "Four.")]


def render(tokenizer, question: str) -> list[int]:
    return chat_tokens(tokenizer, [{"role": "user", "content": question}])


def datum(tokenizer, question: str, answer: str) -> types.Datum:
    prompt = render(tokenizer, question)
    completion = tokenizer.encode(answer, add_special_tokens=False) + [tokenizer.eos_token_id]
    tokens = prompt + completion
    weights = [0.0] * (len(prompt) - 1) + [1.0] * len(completion)
    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                       loss_fn_inputs={"target_tokens": tokens[1:], "weights": weights})


def train(service: tinker.ServiceClient, base_model: str, steps: int, lr: float) -> list[float]:
    client = service.create_lora_training_client(base_model=base_model, rank=16, seed=0).result()
    tokenizer = client.get_tokenizer()
    data = [datum(tokenizer, q, a) for q, a in EXAMPLES]
    tokens = sum(sum(d.loss_fn_inputs["weights"].data) for d in data)
    losses = []
    for step in range(steps):
        fwd_bwd = client.forward_backward(data, "cross_entropy")
        optim = client.optim_step(types.AdamParams(learning_rate=lr))
        losses.append(fwd_bwd.result().metrics["loss:sum"] / tokens)
        optim.result()
        print(f"step {step:3d}  loss/token {losses[-1]:.4f}", flush=True)
    sampler = client.save_weights_and_get_sampling_client().result()
    for question, answer in EXAMPLES:
        out = sampler.sample(types.ModelInput.from_ints(render(tokenizer, question)), 1,
                             types.SamplingParams(max_tokens=16, temperature=0.0)).result()
        text = tokenizer.decode(out.sequences[0].tokens, skip_special_tokens=True)
        print(f"{question!r} -> {text!r} (trained on {answer!r})")
    path = client.save_state("final").result().path
    print(f"saved {path}")
    return losses


def main() -> None:
    parser = example_parser(__doc__)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--lr", type=float, default=1e-2)
    args = parser.parse_args()
    with service_client(args.base_url, args.base_model) as service:
        losses = train(service, args.base_model, args.steps, args.lr)
    print(f"loss/token: {losses[0]:.3f} -> {losses[-1]:.3f}")


if __name__ == "__main__":
    main()
