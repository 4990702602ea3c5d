"""A tiny API: GET /secret, POST /answer (kept in memory), GET /answer, GET /health, GET /greeting."""

import os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SECRET = os.environ["SECRET_WORD"]
answers: list[str] = []


class Handler(BaseHTTPRequestHandler):
    def reply(self, status: int, body: str) -> None:
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/secret":
            self.reply(200, SECRET)
        elif self.path == "/answer":
            self.reply(200, answers[-1] if answers else "")
        elif self.path == "/health":
            self.reply(200, "ok")
        elif self.path == "/greeting":
            with open("/srv/greeting.txt") as handle:
                self.reply(200, handle.read().strip())
        else:
            self.reply(404, "no such path")

    def do_POST(self) -> None:
        if self.path != "/answer":
            self.reply(404, "no such path")
            return
        length = int(self.headers.get("Content-Length") or 0)
        answers.append(self.rfile.read(length).decode(errors="replace").strip())
        self.reply(200, "stored")


print(f"api-server listening on 8000 as uid {os.getuid()}", flush=True)
ThreadingHTTPServer(("127.0.0.1", 8000), Handler).serve_forever()
