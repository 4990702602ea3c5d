"""``skyrl-search``: run a retrieval server, build a BM25 index, evaluate a policy.

    skyrl-search serve [--index DIR] [--corpus FILE] [--host H] [--port P] [--topk K] [--retriever bm25|dense]
                       [--model DIR] [--max-topk N] [--max-queries N] [--max-passages N] [--max-request-s S]
    skyrl-search index --corpus FILE --out DIR
    skyrl-search eval ...            (see skyrl-search eval --help)

``serve`` with neither ``--index`` nor ``--corpus`` serves the built-in corpus (its index is built
on first use). Failures print one line, ``skyrl-search: error: ...``, and exit with status 1.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .config import DEFAULT_MAX_PASSAGES, DEFAULT_MAX_QUERIES, DEFAULT_MAX_REQUEST_S, DEFAULT_MAX_TOPK
from .retrieval import RetrievalError

_EXTRAS = {"fastapi": "server", "uvicorn": "server", "faiss": "dense", "torch": "dense", "transformers": "dense",
           "pyarrow": "parquet"}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="skyrl-search", description="Search-R1-style retrieval for SkyRL.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="{serve,index,eval}")

    serve = commands.add_parser("serve", help="run the retrieval server (Search-R1's POST /retrieve API)",
                                description="Serve POST /retrieve (single 'query' or batched 'queries') and GET "
                                            "/health. Neither --index nor --corpus: the built-in corpus.")
    serve.add_argument("--index", type=Path, help="an index folder built by 'skyrl-search index'")
    serve.add_argument("--corpus", type=Path,
                       help="a JSONL/Parquet corpus, indexed on first use (into --index when given, else the cache)")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default: loopback only)")
    serve.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                       help="a name clients may reach the server by, beyond the loopback ones and --host (their "
                            "Host header); repeatable. Other names get 421, as a DNS-rebinding web page would")
    serve.add_argument("--port", type=int, default=8000, help="port (default: 8000)")
    serve.add_argument("--topk", type=int, default=3, help="passages per query when a request gives no topk")
    serve.add_argument("--retriever", choices=("bm25", "dense"), default="bm25", help="retrieval backend")
    serve.add_argument("--model", help="dense only: the local sentence-embedding model folder to embed with")
    serve.add_argument("--max-topk", type=int, default=DEFAULT_MAX_TOPK,
                       help=f"most passages a request may ask for per query (default: {DEFAULT_MAX_TOPK}; 422 above)")
    serve.add_argument("--max-queries", type=int, default=DEFAULT_MAX_QUERIES,
                       help=f"most queries one request may hold (default: {DEFAULT_MAX_QUERIES}; 422 above); the "
                            "request body limit grows with it (413 above)")
    serve.add_argument("--max-passages", type=int, default=DEFAULT_MAX_PASSAGES,
                       help=f"most passages one request may ask for in all, queries x topk (default: "
                            f"{DEFAULT_MAX_PASSAGES}; 422 above)")
    serve.add_argument("--max-request-s", type=float, default=DEFAULT_MAX_REQUEST_S,
                       help=f"retrieval seconds one request may use; the rest of it is then dropped (default: "
                            f"{DEFAULT_MAX_REQUEST_S:g}; 413)")

    index = commands.add_parser("index", help="build a BM25 index folder from a corpus",
                                description="Index a JSONL/Parquet corpus (wiki-18 'contents' rows or "
                                            "title/text rows) into a BM25 index folder.")
    index.add_argument("--corpus", type=Path, required=True, help="the JSONL/Parquet corpus file")
    index.add_argument("--out", type=Path, required=True, help="the index folder to write (replaced if present)")

    commands.add_parser("eval", help="evaluate a policy on search questions (options: skyrl-search eval --help)",
                        add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["eval"]:
        return _run(_eval, argv[1:])
    args = _parser().parse_args(argv)
    if args.command == "serve":
        return _run(_serve, args)
    return _run(_index, args)


def _run(command: Callable[[Any], int], arguments: Any) -> int:
    """Run a subcommand; a failure becomes one line on stderr and exit status 1."""
    try:
        return command(arguments)
    except ImportError as exc:
        top = (exc.name or "").split(".")[0]
        extra = _EXTRAS.get(top)
        if extra is None:
            _error(str(exc))
        else:
            _error(f"{top} is not installed; install it with: pip install 'skyrl-search[{extra}]'")
    except (OSError, ValueError, RetrievalError) as exc:
        _error(str(exc))
    except KeyboardInterrupt:
        _error("interrupted")
    return 1


def _error(message: str) -> None:
    print(f"skyrl-search: error: {' '.join(message.split())}", file=sys.stderr)


def _serve(args: argparse.Namespace) -> int:
    options: dict[str, Any] = {}
    if args.corpus is not None:
        if not args.corpus.is_file():
            raise FileNotFoundError(f"corpus file {args.corpus} does not exist")
        options["corpus"] = str(args.corpus)
    if args.index is not None:
        if args.corpus is None and not args.index.is_dir():
            raise FileNotFoundError(f"index folder {args.index} does not exist; build one with: "
                                    f"skyrl-search index --corpus FILE --out {args.index}")
        options["index_dir"] = str(args.index)
    if args.model is not None:
        if args.retriever != "dense":
            raise ValueError("--model goes with --retriever dense")
        options["model"] = args.model
    if not 1 <= args.port <= 65535:
        raise ValueError(f"--port must be between 1 and 65535, got {args.port}")
    if args.max_queries < 1:
        raise ValueError(f"--max-queries must be at least 1, got {args.max_queries}")
    if not 1 <= args.topk <= args.max_topk:
        raise ValueError(f"--topk must be between 1 and --max-topk ({args.max_topk}), got {args.topk}")
    if args.max_passages < args.topk:
        raise ValueError(f"--max-passages must be at least --topk ({args.topk}), got {args.max_passages}")
    if not args.max_request_s > 0:  # NaN too
        raise ValueError(f"--max-request-s must be positive, got {args.max_request_s:g}")
    from .server import serve

    serve(host=args.host, port=args.port, topk=args.topk, retriever=args.retriever, options=options,
          max_topk=args.max_topk, max_queries=args.max_queries, max_passages=args.max_passages,
          max_request_s=args.max_request_s, allowed_hosts=args.allowed_host)
    return 0


def _index(args: argparse.Namespace) -> int:
    if not args.corpus.is_file():
        raise FileNotFoundError(f"corpus file {args.corpus} does not exist")
    from .bm25 import BM25Retriever

    retriever = BM25Retriever.build_index(args.corpus, args.out, progress=True)
    print(f"indexed {len(retriever)} passages from {args.corpus} into {args.out}")
    return 0


def _eval(rest: list[str]) -> int:
    from . import evaluate

    return int(evaluate.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
