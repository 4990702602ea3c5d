"""Options of the ``search`` env (section ``env`` of a run config)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field
from skyrl_core import EnvConfig

# The retrieval server's caps per request (skyrl-search serve --max-topk/--max-queries/--max-passages/
# --max-request-s); here, not in the server module, so that the command line shows them without the server
# extra. The env's topk stays within. They are sized for the peers' real batches: Search-R1's trainer sends
# every search of a rollout batch in one request (its GRPO recipe: 512 prompts x 5 samples = 2,560 queries,
# top 3), its retrieval_request.py example 400 queries at top 5; 4,096 queries leaves headroom above both.
DEFAULT_MAX_TOPK = 50
DEFAULT_MAX_QUERIES = 4096
# queries x topk of one request: 4,096 x 4, which also covers 2,560 x 5 and the former cap of 256 x 50 (12,800).
DEFAULT_MAX_PASSAGES = 16_384
# Retrieval time one request may use before the rest of it is dropped (413): half an hour, far above what the
# peers' largest batch costs (seconds on 100k passages), so that it stops only requests that would hold the
# retriever for longer still (4,096 queries of 2,000 characters on a corpus of millions of passages).
DEFAULT_MAX_REQUEST_S = 1800.0


class SearchEnvConfig(EnvConfig):
    max_turns: int = Field(4, ge=1, description="Replies per episode; the last one must answer (SkyRL's recipe: 4).")
    retriever: str = Field("bm25", description="Retriever name: bm25 (in-process), http (a retrieval server), dense "
                                               "(extra [dense]), or one registered by another package.")
    retriever_options: dict[str, Any] = Field(
        default_factory=dict,
        description="Options of the retriever. bm25: index_dir (default: the built-in corpus's index, built on first "
                    "use), corpus (a JSONL/Parquet corpus to index into index_dir). http: url (default "
                    "http://127.0.0.1:8000/retrieve), timeout_s, retries, batched. dense: model, index_dir, corpus.")
    topk: int = Field(3, ge=1, le=DEFAULT_MAX_TOPK, description="Passages shown per search.")
    data_files: dict[str, str] = Field(
        default_factory=dict,
        description="Split -> question file (Search-R1 parquet rows with prompt and reward_spec.ground_truth.target, "
                    "or JSONL rows with question and answers); empty: the built-in questions.")
    reward: Literal["em", "subem", "f1"] = Field("em", description="The reward: exact match after Search-R1's "
                                                                  "normalisation (em), substring EM, or token F1.")
    max_query_chars: int = Field(300, ge=1, description="Longer queries are refused with an observation.")
    max_passage_chars: int = Field(600, ge=50, description="Each passage is cut to this length in the observation.")
