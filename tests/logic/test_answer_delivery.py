"""The answer-delivery contract's pure rules, and the poster reading a
streamed answer from a real local HTTP server (no SGLang)."""
from __future__ import annotations

import http.server
import json
import threading
from types import SimpleNamespace

import pytest

from scripted_runtime.scheduler_side import answer_delivery as ad
from scripted_runtime.scheduler_side.http_poster import HttpAnswer, HttpPoster, parse_event_stream


def _body(ids, reason=None):
    return {"output_ids": list(ids), "meta_info": {"finish_reason": reason}}


EMITTED = _body([5, 6, 7], {"type": "length", "length": 3})


def test_an_answer_equal_to_what_the_scheduler_emitted_passes():
    assert ad.violation(EMITTED, status=200, body=_body([5, 6, 7], {"type": "length"}), error=None,
                        chunks=None) is None


@pytest.mark.parametrize("body, words", [
    (_body([5, 6, 6, 7], {"type": "length"}), "first difference at position 2"),  # a token sent twice
    (_body([5, 6], {"type": "length"}), "2 tokens"),  # a delta lost
    (_body([5, 6, 7], {"type": "stop"}), "finish reason is 'stop'"),
    ({"error": "boom"}, "holds no output_ids"),
])
def test_an_answer_other_than_what_the_scheduler_emitted_is_named(body, words):
    problem = ad.violation(EMITTED, status=200, body=body, error=None, chunks=None)
    assert problem and words in problem


def test_a_failed_post_or_an_error_status_is_named():
    assert "failed: ConnectionRefusedError" in ad.violation(EMITTED, status=None, body=None,
                                                            error="ConnectionRefusedError: x", chunks=None)
    assert "HTTP 500" in ad.violation(EMITTED, status=500, body="oops", error=None, chunks=None)


def test_stream_events_must_each_extend_the_one_before_and_only_the_last_finishes():
    good = [_body([5]), _body([5, 6]), _body([5, 6]), _body([5, 6, 7], {"type": "length"})]
    assert ad.stream_violation(good) is None
    assert ad.violation(EMITTED, status=200, body=good[-1], error=None, chunks=good) is None
    resent = [_body([5]), _body([5, 5]), _body([5, 5, 6, 7], {"type": "length"})]
    assert "does not extend" in ad.stream_violation([_body([5, 6]), _body([5, 7])])
    assert ad.stream_violation(resent) is None  # cumulative, so only the final answer shows a resent token...
    assert "first difference at position 1" in ad.violation(EMITTED, status=200, body=resent[-1], error=None,
                                                             chunks=resent)  # ...and it does
    assert "has a finish reason" in ad.stream_violation([_body([5], {"type": "stop"}), _body([5], {"type": "stop"})])
    assert "has no finish reason" in ad.stream_violation([_body([5]), _body([5, 6])])
    assert "no event" in ad.stream_violation([])


class _Handle:
    def __init__(self, rid, status, emitted_ids, answered=True, body=None):
        self.rid, self.status = rid, status
        self.last_req = SimpleNamespace(output_ids=list(emitted_ids), finished_len=None,
                                        finished_reason=SimpleNamespace(to_json=lambda: {"type": "length"}))
        self.http = HttpAnswer()
        if answered:
            self.http.status, self.http.body = 200, body if body is not None else _body(emitted_ids, {"type": "length"})
            self.http.mark_answered()


def test_check_answers_compares_finished_requests_and_waits_for_every_ended_one():
    handles = [_Handle("a", "finished", [1, 2]), _Handle("b", "aborted", [1]), _Handle("c", "running", [])]
    assert ad.check_answers(handles, timeout_s=1) == 1
    with pytest.raises(ad.AnswerDeliveryError, match=r"request d ended finished .*2 tokens.* no /generate answer "
                                                     r"arrived within 0s"):
        ad.check_answers([_Handle("d", "finished", [1, 2], answered=False)], timeout_s=0.05)
    with pytest.raises(ad.AnswerDeliveryError, match="request e: the answer's output_ids"):
        ad.check_answers([_Handle("e", "finished", [1, 2], body=_body([1, 2, 2], {"type": "length"}))], timeout_s=1)


def test_the_event_stream_parser_reads_sglangs_framing():
    raw = [b'data: {"output_ids": [1]}\n', b"\n", b'data: {"output_ids": [1, 2]}\n', b"\n", b"data: [DONE]\n",
           b'data: {"after": "done"}\n']
    assert parse_event_stream(iter(raw)) == [{"output_ids": [1]}, {"output_ids": [1, 2]}]


class _Sse(http.server.BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for ids in ([4], [4, 5]):
            self.wfile.write(b"data: " + json.dumps({"output_ids": ids}).encode() + b"\n\n")
            self.wfile.flush()
        self.wfile.write(b"data: [DONE]\n\n")

    def log_message(self, *args):
        pass


def test_the_poster_keeps_every_event_of_a_streamed_answer():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Sse)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        answer = HttpPoster(f"http://127.0.0.1:{server.server_address[1]}").post("/generate", {"stream": True})
        assert answer.wait(10)
        assert answer.status == 200 and answer.chunks == [{"output_ids": [4]}, {"output_ids": [4, 5]}]
        assert answer.body == {"output_ids": [4, 5]} and answer.as_dict()["chunks"] == 2
    finally:
        server.shutdown()
        server.server_close()
