"""A small OpenAI-compatible server on loopback that plays a frozen sub-model for the tree tests.

It serves ``/v1/models``, ``/v1/completions`` with token-id prompts, answering with
``choose(first_user, last_user, turn)`` like the scripted policy and reporting sampled tokens as
``"token_id:N"`` (vLLM's ``return_tokens_as_token_ids``), and ``/v1/chat/completions`` answered by
``chat(last_message_text)``. Every prompt it sees is recorded.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@contextmanager
def frozen_model_server(tokenizer: Any, choose: Callable[[str, str, int], str],
                        chat: Callable[[str], str] = lambda prompt: "") -> Iterator[tuple[str, list[str]]]:
    """Yields ``(base_url, prompts_seen)`` while the server runs."""
    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def _send(self, payload: dict) -> None:
            body = json.dumps(payload).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            self._send({"data": [{"id": "frozen"}]})

        def do_POST(self) -> None:
            request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.path.endswith("/chat/completions"):
                prompt = request["messages"][-1]["content"]
                seen.append(prompt)
                self._send({"choices": [{"message": {"role": "assistant", "content": chat(prompt)},
                                         "finish_reason": "stop"}]})
                return
            text = tokenizer.decode(request["prompt"])
            seen.append(text)
            users = [part.split("<|im_end|>", 1)[0] for part in text.split("<|im_start|>user\n")[1:]]
            reply = choose(users[0], users[-1], text.count("<|im_start|>assistant\n") - 1)
            ids = tokenizer.encode(reply, add_special_tokens=False) + [tokenizer.eos_token_id]
            ids = ids[: request["max_tokens"]]
            self._send({"choices": [{"text": reply, "finish_reason": "stop", "logprobs": {
                "tokens": [f"token_id:{i}" for i in ids], "token_logprobs": [-0.5] * len(ids)}}]})

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1", seen
    finally:
        server.shutdown()
        server.server_close()
