"""Dense retrieval end to end with a tiny BERT embedding model built here from a config (nothing downloaded)."""

from __future__ import annotations

import pickle
import re
import sys
from importlib.util import find_spec
from pathlib import Path

import numpy as np
import pytest
from skyrl_search.corpus import write_corpus_jsonl
from skyrl_search.dense import DenseRetriever, Encoder
from skyrl_search.retrieval import Passage, make_retriever

needs_dense = pytest.mark.skipif(any(find_spec(m) is None for m in ("faiss", "torch", "transformers")),
                                 reason="the [dense] extra is not installed")

PASSAGES = [
    Passage("d0", "Lighthouse", "A lighthouse is a tower with a lamp that guides ships at night."),
    Passage("d1", "Volcano", "A volcano is a rupture in the crust where lava and ash escape."),
    Passage("d2", "Glacier", "A glacier is a persistent body of dense ice that moves under its own weight."),
    Passage("d3", "Orchard", "An orchard is a planting of fruit trees such as apple and pear."),
    Passage("d4", "Harbour", "A harbour is sheltered water where ships and boats can dock safely."),
    Passage("d5", "Desert", "A desert is a barren area where little rain falls and few plants grow."),
]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random 2-layer BERT with a word-level vocabulary of the corpus, saved as a Hugging Face folder."""
    for module in ("faiss", "torch", "transformers"):
        pytest.importorskip(module, reason="the [dense] extra is not installed")
    import torch
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import BertConfig, BertModel, PreTrainedTokenizerFast

    folder = tmp_path_factory.mktemp("tiny_e5")
    words = sorted({w for p in PASSAGES for w in re.findall(r"\w+|[^\w\s]", p.contents.lower())}
                   | {"query", "passage", "search", ":", "ships", "night", "ice"})
    vocab = {token: i for i, token in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words])}
    wordpiece = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    wordpiece.normalizer = normalizers.BertNormalizer(lowercase=True)
    wordpiece.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    wordpiece.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=wordpiece, unk_token="[UNK]", pad_token="[PAD]",
                                        cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")
    assert "[UNK]" not in tokenizer.tokenize("query: A glacier is a persistent body of dense ice.")
    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64)
    BertModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("dense_corpus") / "corpus.jsonl"
    write_corpus_jsonl(PASSAGES, path)
    return path


def test_embeddings_are_unit_vectors_and_padding_does_not_change_them(tiny_model: Path) -> None:
    encoder = Encoder(tiny_model, device="cpu")
    texts = ["a glacier is ice", "a volcano is a rupture in the crust where lava and ash escape"]
    together = encoder.encode(texts, prefix="query: ")
    assert together.shape == (2, 32) and together.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(together, axis=1), 1.0, rtol=1e-5)
    alone = encoder.encode(texts[:1], prefix="query: ")  # no padding in a batch of one
    np.testing.assert_allclose(alone[0], together[0], atol=1e-5)
    assert not np.allclose(encoder.encode(texts[:1], prefix="passage: "), alone)  # the prefix is embedded


def test_a_passage_as_its_own_query_comes_first(tiny_model: Path, corpus: Path, tmp_path: Path) -> None:
    retriever = DenseRetriever.build_index(corpus, tmp_path / "idx", tiny_model, query_prefix="", passage_prefix="",
                                           device="cpu", progress=False, batch_size=4)
    results = retriever.retrieve([p.contents for p in PASSAGES], topk=3)
    assert [hits[0].id for hits in results] == [p.id for p in PASSAGES]
    assert all(len(hits) == 3 and hits[0].score == pytest.approx(1.0, abs=1e-4) for hits in results)
    assert results[1][0] == Passage("d1", "Volcano", PASSAGES[1].text, results[1][0].score)
    assert all(type(p.score) is float for hits in results for p in hits)


def test_prefixes_go_into_the_index_and_the_queries(tiny_model: Path, corpus: Path, tmp_path: Path) -> None:
    retriever = DenseRetriever.build_index(corpus, tmp_path / "idx", tiny_model, device="cpu", progress=False)
    stored = retriever.index.reconstruct(2)
    expected = retriever.encoder.encode([PASSAGES[2].contents], prefix="passage: ")[0]
    np.testing.assert_allclose(stored, expected, atol=1e-5)
    [hits] = retriever.retrieve(["dense ice glacier"], topk=len(PASSAGES))
    query = retriever.encoder.encode(["dense ice glacier"], prefix="query: ")[0]
    by_id = {p.id: i for i, p in enumerate(PASSAGES)}
    for hit in hits:
        assert hit.score == pytest.approx(float(retriever.index.reconstruct(by_id[hit.id]) @ query), abs=1e-4)


def test_limits_empty_queries_and_batch_order(tiny_model: Path, corpus: Path, tmp_path: Path) -> None:
    retriever = DenseRetriever.build_index(corpus, tmp_path / "idx", tiny_model, device="cpu", progress=False)
    results = retriever.retrieve(["", "harbour ships", "  ", "orchard apple"], topk=100)
    assert [len(hits) for hits in results] == [0, len(PASSAGES), 0, len(PASSAGES)]
    assert retriever.retrieve(["orchard apple"], topk=2) == [results[3][:2]]
    with pytest.raises(ValueError, match="topk must be at least 1"):
        retriever.retrieve(["x"], topk=0)


def test_saved_index_round_trips_and_options_build_once(tiny_model: Path, corpus: Path, tmp_path: Path) -> None:
    options = {"model": str(tiny_model), "corpus": str(corpus), "index_dir": str(tmp_path / "idx"),
               "device": "cpu", "progress": False}
    first = make_retriever("dense", options)
    manifest = tmp_path / "idx" / "manifest.json"
    built_at = manifest.stat().st_mtime_ns
    assert make_retriever("dense", options) is first and manifest.stat().st_mtime_ns == built_at
    assert first.manifest["passages"] == len(PASSAGES) and first.manifest["dim"] == 32
    queries = ["lava crust", "fruit trees", "tower lamp"]
    expected = first.retrieve(queries, topk=3)
    for mmap in (True, False):
        loaded = DenseRetriever.load(tmp_path / "idx", mmap=mmap, device="cpu")  # the model named in the manifest
        assert [[p.id for p in hits] for hits in loaded.retrieve(queries, topk=3)] == \
            [[p.id for p in hits] for hits in expected]
    copy = pickle.loads(pickle.dumps(first))  # e.g. handed to a worker process: reloads from the folder
    assert copy.retrieve(queries, topk=3) == expected
    changed = {**options, "query_prefix": "search: "}
    assert make_retriever("dense", changed).manifest["query_prefix"] == "search: "  # settings changed: rebuilt


@needs_dense
def test_dense_options_errors_name_what_is_wrong(tmp_path: Path, corpus: Path) -> None:
    with pytest.raises(ValueError, match="needs 'model'"):
        make_retriever("dense", {"corpus": str(corpus)})
    with pytest.raises(FileNotFoundError, match="embedding model folder .*missing-model does not exist"):
        make_retriever("dense", {"corpus": str(corpus), "model": str(tmp_path / "missing-model"),
                                 "index_dir": str(tmp_path / "idx")})
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="empty holds no dense index"):
        make_retriever("dense", {"index_dir": str(tmp_path / "empty")})
    with pytest.raises(ValueError, match="unknown dense retriever options \\['k'\\]"):
        make_retriever("dense", {"k": 3})


def test_missing_dense_extra_names_the_install_command(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "faiss", None)  # what an environment without faiss-cpu imports
    with pytest.raises(ImportError, match=r"faiss is missing.*pip install 'skyrl-search\[dense\]'"):
        Encoder(tmp_path)
