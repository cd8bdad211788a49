"""Unit tests of pure logic (no SGLang process): small fakes are fine here."""
from __future__ import annotations

import contextlib
import re
import subprocess
import sys
import time

import pytest
import zmq

from scripted_runtime.hooks import sglang_compat
from scripted_runtime.user_side import cli, engine_config
from scripted_runtime.scheduler_side.context.waits import WaitTimeout, wait_until
from scripted_runtime.scheduler_side.control import ControlLedger, ControlOp, pause_posted_last
from scripted_runtime.scheduler_side.http_poster import HttpAnswer
from scripted_runtime.protocol import ScriptTarget
from scripted_runtime.user_side.server import last_traceback, script_target


def test_parse_version_orders_releases():
    assert sglang_compat.parse_version("0.5.12.post1") == (0, 5, 12, 1)
    assert sglang_compat.parse_version("0.5.8.post1") < sglang_compat.parse_version("0.5.9")
    assert sglang_compat.parse_version("0.5.23") > sglang_compat.parse_version("0.5.13")


def test_omp_bind_rule_per_release():
    # 0.5.23: one entry per world rank; 0.5.12.post1: one per TP rank (docs/sglang-facts.md, "Older releases")
    assert sglang_compat.omp_bind_rule("0.5.23").value(tp_size=1, pp_size=4, cores=2) == "0|1|0|1"
    assert sglang_compat.omp_bind_rule("0.5.12.post1").value(tp_size=1, pp_size=4, cores=2) == "0-1"
    assert sglang_compat.omp_bind_rule("0.5.23").value(tp_size=1, pp_size=1, cores=2) == "0-1"
    assert sglang_compat.omp_bind_rule("0.5.13").value(tp_size=1, pp_size=4, cores=2) == "0-1"


def test_omp_bind_rule_by_feature(tmp_path):
    pkg = tmp_path / "sglang"
    (pkg / "srt" / "utils").mkdir(parents=True)
    assert not sglang_compat.omp_bind_rule(pkg_dir=str(pkg)).per_world_rank  # 0.5.13 and older
    (pkg / "srt" / "utils" / "numa_utils.py").write_text('os.environ.get("SGLANG_CPU_OMP_THREADS_BIND")')
    assert sglang_compat.omp_bind_rule(pkg_dir=str(pkg)).per_world_rank  # 0.5.2x
    assert sglang_compat.omp_bind_rule().per_world_rank  # the installed 0.5.23


def test_iteration_entry_by_feature():
    import types

    class New:  # 0.5.2x
        def ingest_requests(self): ...
        def recv_requests(self): ...

    class Old:  # <=0.5.12.post1
        def recv_requests(self): ...

    class Receiver:
        def recv_requests(self): ...

    class Mid:  # 0.5.13: the loops call self.request_receiver.recv_requests()
        def init_request_receiver(self): ...

    entry = lambda cls, **extra: sglang_compat.iteration_entry(types.SimpleNamespace(Scheduler=cls, **extra))
    assert (entry(New).owner, entry(New).method, entry(New).on_receiver) == (New, "ingest_requests", False)
    assert (entry(Old).owner, entry(Old).method) == (Old, "recv_requests")
    mid = entry(Mid, SchedulerRequestReceiver=Receiver)
    assert (mid.owner, mid.method, mid.on_receiver) == (Receiver, "recv_requests", True)
    with pytest.raises(RuntimeError, match="no known iteration entry"):
        entry(Mid)


def test_engine_kwargs_and_topologies():
    kw = engine_config.engine_kwargs("cpu", "pp4", chunked_prefill_size=32)
    assert kw["pp_size"] == 4 and kw["pp_async_batch_depth"] == 2
    assert kw["chunked_prefill_size"] == 32 and kw["device"] == "cpu"
    assert engine_config.engine_kwargs("cpu", "pp1-normal")["disable_overlap_schedule"] is True
    assert engine_config.topology_for(1, True) == "pp1-overlap"
    assert engine_config.topology_for(1, False) == "pp1-normal"
    with pytest.raises(ValueError, match="--pp must be 1 or 4"):
        engine_config.topology_for(2, True)
    with pytest.raises(ValueError, match="topology must be one of"):
        engine_config.engine_kwargs("cpu", "pp8")


def test_parse_engine_args():
    parsed = engine_config.parse_engine_args(
        ["chunked-prefill-size=32", "disable_radix_cache=true", "log_level=info", "x=None"])
    assert parsed == {"chunked_prefill_size": 32, "disable_radix_cache": True, "log_level": "info", "x": None}
    with pytest.raises(ValueError, match="key=value"):
        engine_config.parse_engine_args(["novalue"])


def test_script_target_forms(tmp_path):
    def local(ctx):
        yield

    t = script_target(local)
    assert t.qualname.endswith("local") and t.path == __file__
    assert script_target("pkg.mod:fn") == ScriptTarget(qualname="fn", module="pkg.mod")
    assert script_target("a/b.py:fn").path.endswith("a/b.py")
    with pytest.raises(ValueError, match="PATH.py:FUNCTION"):
        script_target("nocolon")


def test_wait_until_counts_steps_and_names_what_it_waited_for():
    box = {"n": 0}

    def pred():
        box["n"] += 1
        return box["n"] >= 3

    gen = wait_until(pred, max_steps=10, what="x")
    steps = 0
    with pytest.raises(StopIteration) as stop:
        while True:
            next(gen)
            steps += 1
    assert stop.value.value == 2 and steps == 2
    gen = wait_until(lambda: False, max_steps=2, what="the thing", describe=lambda: "STATE")
    with pytest.raises(WaitTimeout, match="waited 2 steps for the thing; state seen: STATE"):
        for _ in range(5):
            next(gen)


class _Req:
    def __init__(self, rid=None):
        self.rid = rid


class FlushCacheReqInput(_Req):
    pass


class AbortReq(_Req):
    pass


class _Out:
    def __init__(self, success):
        self.success = success
        self.message = "m"


def test_ledger_matches_answers_to_ops_in_order():
    step = {"v": 1}
    ledger = ControlLedger(lambda: step["v"])
    a = ledger.register(ControlOp("flush", "FlushCacheReqInput", None, 0, HttpAnswer()))
    b = ledger.register(ControlOp("flush", "FlushCacheReqInput", None, 0, HttpAnswer()))
    ab = ledger.register(ControlOp("abort", "AbortReq", "r2", 0, HttpAnswer()))
    ledger.on_processed(AbortReq("r1"), None)  # someone else's abort
    assert not ab.processed
    ledger.on_processed(FlushCacheReqInput(), _Out(False))
    step["v"] = 2
    ledger.on_processed(FlushCacheReqInput(), _Out(True))
    ledger.on_processed(AbortReq("r2"), None)
    assert (a.success, a.processed_step) == (False, 1)
    assert (b.success, b.processed_step) == (True, 2)
    assert ab.processed and ab.success is True  # processed, no verdict to give
    assert [d["op"] for d in ledger.log()] == ["flush", "flush", "abort"]


def test_op_success_falls_back_to_http():
    op = ControlOp("pause", "PauseGenerationReqInput", None, 0, HttpAnswer())
    assert op.success is None
    op.http.status, op.http.body = 400, {"success": False, "message": "nope"}
    assert op.success is False and op.message == "nope"


def test_the_tokenizer_counts_as_paused_after_a_pause_until_a_continue():
    def op(name):
        return ControlOp(name, "X", None, 0, HttpAnswer())

    assert pause_posted_last([]) is False
    assert pause_posted_last([op("flush_cache")]) is False
    assert pause_posted_last([op("pause_generation(retract)"), op("flush_cache")]) is True
    assert pause_posted_last([op("pause_generation(in_place)"), op("continue_generation")]) is False
    assert pause_posted_last([op("continue_generation"), op("pause_generation(abort)"), op("abort(r1)")]) is True


def test_last_traceback_extracts_final_block():
    log = "noise\nTraceback (most recent call last):\n  File x\nValueError: first\nmore\n" \
          "Traceback (most recent call last):\n  File y\n    boom()\nRuntimeError: second\ntrailing"
    tb = last_traceback(log)
    assert tb.startswith("Traceback") and tb.endswith("RuntimeError: second")


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


def test_cli_usage_errors_exit_2(tmp_path):
    scenario = tmp_path / "s.py"
    scenario.write_text("def real(ctx):\n    yield\n")
    assert cli.check_script_spec(f"{scenario}:real").endswith("s.py:real")
    for spec, message in [
        (f"{tmp_path}/missing.py:real", "scenario file not found"),
        (f"{scenario}:nope", "has no function 'nope' (functions: real)"),
        ("no.such.module:fn", "scenario module not found"),
        ("justaname", "PATH.py:FUNCTION"),
    ]:
        with pytest.raises(cli.UsageError, match=re.escape(message)):
            cli.check_script_spec(spec)
    proc = subprocess.run([sys.executable, "-m", "scripted_runtime.user_side.cli", "run", f"{scenario}:nope"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0, "a usage error is one line"
    proc = subprocess.run([sys.executable, "-m", "scripted_runtime.user_side.cli", "run", f"{scenario}:real", "--pp", "3"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--pp must be 1 or 4" in proc.stderr


def test_fix_toggle_names_are_validated(capsys):
    from scripted_runtime.hooks import fix_toggles

    with pytest.raises(ValueError, match=r"unknown fix toggle\(s\) \['pr1'\]; known: pr27446"):
        fix_toggles.validate(["pr1"])
    assert cli.main(["run", "scenarios/demo.py:chunked_then_decode", "--revert-fix", "pr1"]) == 2
    assert "unknown fix toggle(s) ['pr1']" in capsys.readouterr().err


def test_state_scan_sees_every_place_and_tells_live_from_finished():
    """The scan walks running_batch, last_batch, chunked_req, the overlap
    result_queue, the PP slot lists and the waiting queue, each request once."""
    from types import SimpleNamespace as NS

    from scripted_runtime.scheduler_side import state

    def req(rid, done=False):
        return NS(rid=rid, finished=lambda: done)

    a, b, c, d = req("a"), req("b", done=True), req("c"), req("d")
    s = NS(running_batch=NS(reqs=[a]), last_batch=NS(reqs=[a, b]), chunked_req=None,
           result_queue=[(NS(reqs=[c]), object())], mbs=[None, NS(reqs=[b])], last_mbs=[], running_mbs=None,
           waiting_queue=[d])
    assert [h.label for h in state.holders(s)] == [
        "running_batch", "last_batch", "result_queue[0]", "mbs[1]", "waiting_queue"]
    assert [r.rid for r in state.iter_reqs(s)] == ["a", "b", "c", "d"]
    assert sorted(state.live_reqs(s)) == ["a", "c", "d"] and state.any_live(s)
    assert state.where_is(s, "b") == ["last_batch", "mbs[1]"]
    only_finished = NS(running_batch=NS(reqs=[b]), waiting_queue=[])
    assert not state.any_live(only_finished) and not state.nothing_held(only_finished)
    empty = NS(running_batch=None, waiting_queue=[])
    assert state.nothing_held(empty) and not state.any_live(empty)


def test_reset_fingerprint_diff_names_each_part_left_behind():
    from scripted_runtime.scheduler_side import reset_fingerprint as fp

    fresh = {"rows": tuple(range(12)), "paused": False, "ratio": 0.7}
    assert fp.diff(fresh, dict(fresh)) == []
    reordered = {**fresh, "rows": (1, 0) + tuple(range(2, 12))}
    assert fp.diff(fresh, reordered) == ["rows: the same 12 but in another order (first [1, 0, 2, 3, 4, 5], "
                                         "fresh [0, 1, 2, 3, 4, 5])"]
    leaked = {**fresh, "rows": tuple(range(1, 12)), "paused": True}
    assert fp.diff(fresh, leaked) == ["rows: 11 now, 12 on the fresh engine; missing [0]",
                                      "paused: True now, False on the fresh engine"]
