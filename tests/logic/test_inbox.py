"""The scheduler's socket inbox (``scheduler_side/inbox.py``) on a real
zmq PUSH/PULL pair with frames sent as SGLang's tokenizer sends them:
buffering, waits with a deadline, and the reset's injected flush. No
SGLang process."""
from __future__ import annotations

import contextlib
import time

import pytest
import zmq

from scripted_runtime.hooks import sglang_compat


@contextlib.contextmanager
def push_pull():
    """A connected zmq PUSH/PULL pair on localhost (the tokenizer's socket and the scheduler's)."""
    ctx = zmq.Context()
    push, pull = ctx.socket(zmq.PUSH), ctx.socket(zmq.PULL)
    port = pull.bind_to_random_port("tcp://127.0.0.1")
    push.connect(f"tcp://127.0.0.1:{port}")
    try:
        yield push, pull
    finally:
        push.close(0)
        pull.close(0)
        ctx.term()


def test_inbox_buffers_frames_and_waits_with_deadline():
    """Frames are sent as the tokenizer sends them (io_struct.sock_send:
    pickle, or msgpack under SGLANG_USE_PICKLE_IPC=0), so this holds in both
    IPC modes."""
    io = pytest.importorskip("sglang.srt.managers.io_struct")
    from scripted_runtime.scheduler_side.inbox import ArrivalTimeout, TokenizerInbox

    with push_pull() as (push, pull):
        inbox = TokenizerInbox(pull)
        seen = []
        inbox.arrival_listeners.append(lambda obj: seen.append(obj))
        io.sock_send(push, io.FlushCacheReqInput(rid="x"))
        inbox.wait_for(lambda o: isinstance(o, io.FlushCacheReqInput), timeout_s=5, what="flush")
        assert [o.rid for o in seen] == ["x"]
        assert io.sock_recv(inbox, zmq.NOBLOCK).rid == "x"  # handed on unchanged
        with pytest.raises(zmq.Again):
            inbox.recv(zmq.NOBLOCK)
        t0 = time.monotonic()
        with pytest.raises(ArrivalTimeout, match="abort did not reach the scheduler within 0s"):
            inbox.wait_for(lambda o: False, timeout_s=0.2, what="abort")
        assert time.monotonic() - t0 < 2


def test_reset_flush_is_read_by_the_scheduler_behind_what_arrived_and_only_it_is_marked():
    """The reset hands its flush to the inbox instead of posting it: the
    scheduler's own read (io_struct.sock_recv, msgpack or pickle as this
    release's IPC is) must get a FlushCacheReqInput that the driver knows as
    the reset's, after any frame already on the socket; a script's flush
    (posted over HTTP, answered to the tokenizer) must not look like it."""
    io = pytest.importorskip("sglang.srt.managers.io_struct")
    from scripted_runtime.scheduler_side.inbox import TokenizerInbox

    with push_pull() as (push, pull):
        inbox = TokenizerInbox(pull)
        seen = []
        inbox.arrival_listeners.append(seen.append)
        io.sock_send(push, io.FlushCacheReqInput())  # a script's flush, as the tokenizer sends it
        inbox.wait_for(lambda o: True, timeout_s=5, what="the script's flush")
        inbox.inject(*sglang_compat.reset_flush_frame())
        first, second = io.sock_recv(inbox, zmq.NOBLOCK), io.sock_recv(inbox, zmq.NOBLOCK)
        assert type(first) is io.FlushCacheReqInput and not sglang_compat.is_reset_flush(first)
        assert type(second) is io.FlushCacheReqInput and sglang_compat.is_reset_flush(second)
        assert len(seen) == 1, "an injected frame was not posted: arrival listeners must not hear of it"
        with pytest.raises(zmq.Again):
            inbox.recv(zmq.NOBLOCK)
        assert not sglang_compat.is_reset_flush(io.AbortReq(rid=sglang_compat.RESET_FLUSH_RID))


def test_a_marked_reset_flush_needs_the_marker_an_unmarked_one_matches_by_type():
    """``is_reset_flush(marked=True)`` (what another PP rank asks): only the
    frame carrying ``RESET_FLUSH_RID``; without ``marked``, a flush with no
    rid at all still counts (a release whose request has no rid field)."""
    from types import SimpleNamespace

    from scripted_runtime.hooks import sglang_compat

    FlushCacheReqInput = type("FlushCacheReqInput", (SimpleNamespace,), {})
    marked, bare = FlushCacheReqInput(rid=sglang_compat.RESET_FLUSH_RID), FlushCacheReqInput()
    script_flush = FlushCacheReqInput(rid="a-script-flush")
    assert sglang_compat.is_reset_flush(marked) and sglang_compat.is_reset_flush(marked, marked=True)
    assert sglang_compat.is_reset_flush(bare) and not sglang_compat.is_reset_flush(bare, marked=True)
    assert not sglang_compat.is_reset_flush(script_flush)
    assert not sglang_compat.is_reset_flush(script_flush, marked=True)
