"""Crashes, restarts, shutdown time and leftover processes (real SGLang)."""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from scripted_runtime import ServerConfig, timeline
from scripted_runtime.user_side import processes
from scripted_runtime.errors import ServerDeadError
from tests.helpers import run_ok
from tests.server.test_scheduler_api import script_lifecycle


def script_sabotage(ctx):
    """Make the scheduler's own event loop raise in the next iteration."""
    r = ctx.start_req(prompt_len=8, max_new_tokens=50, ignore_eos=True)
    yield from ctx.wait_until(lambda: len(r.output_ids) >= 1, max_steps=50, what="first token")

    def get_next_batch_to_run(*args, **kwargs):
        raise RuntimeError("sabotaged by the test")

    ctx.scheduler.get_next_batch_to_run = get_next_batch_to_run
    for _ in range(5):
        yield


@pytest.mark.crashes_server
def test_crash_is_reported_fast_and_leaves_nothing(server_pool):
    """Runs last (``crashes_server``): the pool's server it kills is not
    needed again, so no restart is paid for it. On pp1-overlap; pp1-normal's
    pool server ends in the reset-fingerprint test below, a pp1-normal crash
    is in the standby test, and at pp=4 a real SGLang crash, the known bug
    pp_retract_chunk_double_release (tests/server/test_known_bugs.py), shows the
    same: each extra restart would cost the suite 18-35 s."""
    server = server_pool.get("pp1-overlap")
    t0 = time.monotonic()
    result = server.run(script_sabotage)
    elapsed = time.monotonic() - t0
    assert result.crashed and not result.passed
    assert "sabotaged by the test" in result.traceback
    assert result.error.startswith("SchedulerCrashed:")
    assert elapsed < 15, f"crash took {elapsed:.1f}s to report"
    # the trace up to the step before the crash, cut to its text (no mapped-ahead NUL bytes)
    raw = Path(result.trace_path).read_bytes()
    assert raw.endswith(b"\n") and b"\0" not in raw
    _, records = timeline.load(result.trace_path)
    assert records and records[-1]["step"] >= 1 and result.steps == records[-1]["step"]
    assert not server.alive
    assert server.pids() == [], "a crashed server must leave no process behind"
    with pytest.raises(ServerDeadError, match="restart"):
        server.run(script_lifecycle)


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().split(b"\0")[0].decode(errors="replace")
    except OSError:
        return "?"


def script_leave_a_stuck_admission_ratio(ctx):
    """A planted fault: the scheduler's admission estimate is replaced by one
    that its idle check cannot reset, so no reset can restore it."""

    class StuckRatio:
        init = min = decay = current = 0.05

        def reset(self):
            pass

        def decay_step(self):
            pass

    ctx.scheduler.new_token_ratio_tracker = StuckRatio()
    yield


@pytest.mark.crashes_server  # leaves its server unusable on purpose: runs last, then shuts it down
def test_a_reset_that_leaves_state_behind_is_a_named_reset_error(server_pool):
    server = server_pool.get("pp1-normal")
    try:
        run_ok(server, script_lifecycle)  # the server's first reset has recorded the fresh fingerprint by now
        run_ok(server, script_leave_a_stuck_admission_ratio)
        result = server.run(script_lifecycle)
        assert not result.passed and result.error.startswith("ResetError: the reset did not give back"), \
            result.summary()
        assert "new_token_ratio: 0.05 now" in result.error, result.error
        assert result.steps == 0  # the script never ran on the changed engine
    finally:
        server.shutdown()


def test_after_a_crash_a_standby_takes_over_at_once_then_shutdown_is_fast_and_leaves_nothing():
    """One runner with servers of its own (pp1-normal; none of this depends
    on the topology), as ``explore --standby on`` uses them: a second server
    of the same configuration starts in the background; when a script kills
    the live one, the next program runs on the standby at once and a new
    standby starts; the live server's processes are all found (SGLang renames
    its ranks), shutdown is fast, and closing the runner leaves no process of
    any of the three servers. (A plain restart, without a standby, is what
    the suite's server pool does after the known-bug crashes.)"""
    from scripted_runtime.scheduler_side.invariants import NAMES
    from scripted_runtime.user_side.explore import actions as A
    from scripted_runtime.user_side.explore.runner import ExampleRunner

    runner = ExampleRunner(ServerConfig("pp1-normal", checks=[n for n in NAMES if n != "greedy_output"]),
                           standby="on")
    servers = []
    try:
        runner.ensure_server()
        servers.append(runner.server)
        assert runner.standby.wait_ready(180), \
            f"the standby did not come up in 180 s: {runner.standby.error or 'still starting'}"
        crashed = runner.server.run(script_sabotage)
        assert crashed.crashed and "sabotaged by the test" in crashed.traceback
        t0 = time.monotonic()
        after = runner.run([A.Start(8, 1, 2)])
        took = time.monotonic() - t0
        assert (runner.swaps, runner.restarts) == (1, 1)
        assert after.signature is None, after
        assert took < 10, f"crash to the next program took {took:.1f}s with a standby ready"
        server = runner.server
        servers += [server, runner.standby.server]
        pids = server.pids()
        names = {pid: _cmdline(pid) for pid in pids}
        # SGLang renames its ranks (setproctitle), which wipes the environment
        # marker they inherited: they must be found all the same.
        assert server.info["pid"] in pids, f"the scheduler (pid {server.info['pid']}) is not among {names}"
        assert any(n.startswith("sglang::detokenizer") for n in names.values()), f"no detokenizer in {names}"
        run_ok(server, script_lifecycle)
        took = server.shutdown()
        assert took < 5.0, f"shutdown took {took:.1f}s"
        assert [p for p in pids if processes.is_running(p)] == []
    finally:
        runner.close()
    left = [pid for s in servers for pid in s.pids()]
    assert left == [], f"processes left: {left}"
