"""An HTTP authentication service the tests run: answers per username, records each request, can be slowed
and stopped (broker/authn/http.py's counterpart). Its ACL endpoint (acl_url) allows a user its own topics
(`<username>/...`), leaves `free/...` to the broker's rules (ignore) and denies the rest."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ANSWERS = {
    "alice": {"result": "allow", "acl": [{"permission": "allow", "action": "all", "filter": "alice/#"}]},
    "root": {"result": "allow", "is_superuser": True},
    "mallory": {"result": "deny"},
    "carol": {"result": "allow"},
}


def acl_answer(username: str, topic: str) -> str:
    if topic.startswith(f"{username}/"):
        return "allow"
    return "ignore" if topic.startswith("free/") else "deny"


class AuthService:
    """The platform's auth service: answers per username (ANSWERS, else ignore), records the requests."""

    def __init__(self) -> None:
        self.requests: list[dict[str, object]] = []
        self.acl_requests: list[dict[str, object]] = []
        self.delay = 0.0
        service = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                time.sleep(service.delay)
                if self.path == "/mqtt/acl":
                    service.acl_requests.append(body)
                    result = {"result": acl_answer(body["username"], body["topic"])}
                else:
                    service.requests.append({**body, "api_key": self.headers.get("X-Api-Key")})
                    result = ANSWERS.get(body.get("username"), {"result": "ignore"})
                answer = json.dumps(result).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/mqtt/auth"
        self.acl_url = f"http://127.0.0.1:{self.port}/mqtt/acl"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        if self.thread.is_alive():
            self.server.shutdown()
            self.server.server_close()
            self.thread.join(5)
