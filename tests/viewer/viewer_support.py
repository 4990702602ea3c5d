"""A real training run whose RLM roots make sub-calls: the ``hf`` engine on tiny-random, except that a
few first turns are scripted (tiny-random never writes an ``rlm_query`` call by itself).

Roots open with a REPL block that sends two sub-prompts to ``rlm_query_batched``; each child opens
with a block that asks one grandchild and returns its answer; grandchildren and every later turn are
the model's own samples. The trainer trains on all of it, as on any rollout.
"""

from __future__ import annotations

from typing import Any

from skyrl_core import EngineSpec, hookimpl
from skyrl_core.engine import GenerateOutput, SamplingParams
from skyrl_trainers.engines.hf import HFEngine

SCRIPTED_LOGPROB = -0.7
CHILD_PROMPTS = ("CHILD: first word?", "CHILD: last word?")
ROOT_CODE = f"a = rlm_query_batched({list(CHILD_PROMPTS)!r})\nprint(a)"
CHILD_CODE = "FINAL('saw ' + rlm_query('LEAF: a word?'))"


def repl(code: str) -> str:
    return f"```repl\n{code}\n```"


def scripted_reply(first_user: str, turn: int) -> str | None:
    """The scripted action for an episode's ``turn`` (from 0), or ``None`` to let the model sample."""
    if turn != 0 or first_user.startswith("LEAF"):
        return None
    return repl(CHILD_CODE) if first_user.startswith("CHILD") else repl(ROOT_CODE)


class RLMScriptHFEngine(HFEngine):
    """The ``hf`` engine with the scripted first turns of :func:`scripted_reply` (chatml prompts)."""

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> GenerateOutput:
        text = self.tokenizer.decode(prompt_ids)
        users = [part.split("<|im_end|>", 1)[0] for part in text.split("<|im_start|>user\n")[1:]]
        reply = scripted_reply(users[0] if users else "", text.count("<|im_start|>assistant\n") - 1)
        if reply is None:
            return await super().generate(prompt_ids, params)
        ids = list(self.tokenizer.encode(reply, add_special_tokens=False))
        ids.append((params.stop_token_ids or [self.tokenizer.eos_token_id])[0])
        reason = "stop" if len(ids) <= params.max_tokens else "length"
        ids = ids[: params.max_tokens]
        return GenerateOutput(ids, [SCRIPTED_LOGPROB] * len(ids), reason, reply,
                              metadata={"weight_version": self.weight_version})


class ViewerTestPlugin:
    @hookimpl
    def register_inference_engines(self, register: Any) -> None:
        register(EngineSpec(id="rlm_script_hf", entry_point="viewer_support:RLMScriptHFEngine",
                            config="skyrl_trainers.engines.hf:HFEngineConfig"))

