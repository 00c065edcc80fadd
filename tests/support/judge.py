"""A stand-in OpenAI-compatible judge: a real HTTP server on loopback (http.server in a thread).

It answers POST /v1/chat/completions like an endpoint would. Its verdict is a deterministic function of
the answers it is shown: pairwise, the answer with more distinct words wins (`[[A]]`/`[[B]]`, `[[C]]` on
equal counts); single, `[[n]]` with n = min(10, distinct words). `script` is a list of canned replies
sent first, one per request: (status, headers, body bytes, seconds to stall before answering). Every
request is counted (`hits`) and its Authorization header kept (`auth`); `peak` is the most requests it was
answering at once.
"""

from __future__ import annotations

import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def distinct(text: str) -> int:
    return len(set(text.split()))


def verdict_for(messages: list[dict]) -> str:
    user = messages[-1]["content"]
    pair = re.search(r"Assistant A's Answer\]\n(.*)\n\[The End of Assistant A's Answer\].*"
                     r"Assistant B's Answer\]\n(.*)\n\[The End of Assistant B's Answer\]", user, re.S)  # fmt: skip
    if pair:
        a, b = distinct(pair.group(1)), distinct(pair.group(2))
        return "Both are short. " + ("[[A]]" if a > b else "[[B]]" if b > a else "[[C]]")
    one = re.search(r"Assistant's Answer\]\n(.*)\n\[The End of Assistant's Answer\]", user, re.S)
    return f"Rating: [[{min(10, max(1, distinct(one.group(1)) if one else 1))}]]"


class JudgeServer:
    def __init__(self, script=None, verdict=verdict_for):
        self.script = list(script or [])
        self.verdict = verdict
        self.hits = 0
        self.in_flight = self.peak = 0
        self.auth: list[str | None] = []
        self.bodies: list[dict] = []
        self.lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with owner.lock:
                    owner.hits += 1
                    owner.in_flight += 1
                    owner.peak = max(owner.peak, owner.in_flight)
                    owner.auth.append(self.headers.get("Authorization"))
                    owner.bodies.append(body)
                    canned = owner.script.pop(0) if owner.script else None
                if canned is not None:
                    status, headers, raw, stall = canned
                    time.sleep(stall)
                else:
                    text = owner.verdict(body["messages"])
                    status, headers, stall = 200, {}, 0
                    raw = json.dumps({"id": "x", "object": "chat.completion", "model": body["model"],
                                      "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                                   "finish_reason": "stop"}],
                                      "usage": {"total_tokens": 42}}).encode()  # fmt: skip
                try:
                    self.send_response(status)
                    for k, v in headers.items():
                        self.send_header(k, v)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(raw)))
                    self.end_headers()
                    self.wfile.write(raw)
                except OSError:  # the client gave up (a timeout test)
                    pass
                finally:
                    with owner.lock:
                        owner.in_flight -= 1

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> JudgeServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
