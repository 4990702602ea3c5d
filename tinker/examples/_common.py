"""What the example loops share: their command line's server options, a Tinker service client on a server (a
running one, or one started in this process for the run), and chat prompts as token ids.

Imported by ``rl_loop.py`` and ``sl_loop.py`` as a sibling module: run them as scripts
(``python tinker/examples/rl_loop.py``), which puts this folder on ``sys.path``.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager

import tinker

API_KEY = "tml-local"  # what a server started without --api-keys accepts


def example_parser(doc: str) -> argparse.ArgumentParser:
    """A parser described by the first line of ``doc``, with ``--base-url`` and ``--base-model``."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--base-url", help="a running skyrl-tinker server; default: start one in this process")
    parser.add_argument("--base-model", default="tiny-random")
    return parser


@contextmanager
def service_client(base_url: str | None, base_model: str) -> Iterator[tinker.ServiceClient]:
    """A client of the server at ``base_url``, else of a server of ``base_model`` started in this process; on the
    way out the client is closed and a server started here stopped."""
    server = None
    if base_url is None:
        from skyrl_tinker.app import ServerConfig
        from skyrl_tinker.local import LocalServer

        server = LocalServer(ServerConfig(base_model=base_model))
        base_url = server.url
    service = tinker.ServiceClient(base_url=base_url, api_key=API_KEY)
    try:
        yield service
    finally:
        service.close("success")
        if server is not None:
            server.stop()


def chat_tokens(tokenizer, messages: list[dict[str, str]]) -> list[int]:
    """``messages`` in the model's chat template, ready for the assistant's turn, as token ids."""
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer.encode(text, add_special_tokens=False)
