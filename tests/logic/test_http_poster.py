"""The in-scheduler HTTP poster against a local HTTP server (no SGLang)."""
from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from scripted_runtime.scheduler_side.http_poster import HttpPoster


class Recorder(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    seen: list = []
    auth: list = []

    def do_POST(self):
        n = int(self.headers.get("Content-Length", 0))
        raw = self.rfile.read(n)
        Recorder.seen.append((self.path, self.headers.get("Content-Type"), raw))
        Recorder.auth.append(self.headers.get("Authorization"))
        if self.path == "/text":
            body, status = b"not json", 503
        else:
            body, status = json.dumps({"echo": raw.decode() or None}).encode(), 200
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def http_server():
    Recorder.seen, Recorder.auth = [], []
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def test_json_payload_and_answer(http_server):
    answer = HttpPoster(http_server + "/").post("/generate", {"text": "hi", "n": 2})
    assert answer.wait(10)
    assert answer.status == 200 and answer.error is None
    assert json.loads(answer.body["echo"]) == {"text": "hi", "n": 2}
    path, ctype, _ = Recorder.seen[0]
    assert (path, ctype) == ("/generate", "application/json")


def test_no_payload_sends_no_body(http_server):
    answer = HttpPoster(http_server).post("/flush_cache", None)
    assert answer.wait(10)
    assert answer.status == 200 and answer.body == {"echo": None}
    assert Recorder.seen[0] == ("/flush_cache", None, b"")


def test_non_json_answer_kept_as_text(http_server):
    answer = HttpPoster(http_server).post("/text", {})
    assert answer.wait(10)
    assert (answer.status, answer.body) == (503, "not json")


def test_connection_refused_is_an_error_not_an_exception():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again when the block ends: nothing listens there
    answer = HttpPoster(f"http://127.0.0.1:{port}").post("/generate", {})
    assert answer.wait(10)
    assert answer.status is None and answer.done
    assert "ConnectionRefusedError" in answer.error


def test_bad_url_is_rejected():
    with pytest.raises(ValueError, match="http://host:port"):
        HttpPoster("tcp://127.0.0.1:5")


def test_every_post_carries_the_servers_key_when_it_has_one(http_server):
    """SGLang's api_key / admin_api_key (one per server start): a call without it gets 401."""
    assert HttpPoster(http_server, api_key="k3y").post("/flush_cache", None).wait(10)
    assert HttpPoster(http_server, api_key="k3y").post("/generate", {"text": "hi"}).wait(10)
    assert HttpPoster(http_server).post("/generate", {}).wait(10)
    assert Recorder.auth == ["Bearer k3y", "Bearer k3y", None]
