"""Every named race window is reached on the real scheduler, where it applies,
and reports its hit count; a window that never opens fails with the state."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import run_ok

WINDOWS = Path(__file__).resolve().parents[2] / "scenarios" / "windows.py"


@pytest.fixture
def overlap_server(server_pool):
    return server_pool.get("pp1-overlap")


@pytest.mark.parametrize("name", [
    "finished_not_pruned", "chunked_between_chunks", "overlap_result_pending",
    "paused_in_place_busy", "paused_retract_waiting_with_kv", "decode_retracted_waiting", "prefill_not_merged",
])
def test_window_reached_on_overlap_default(overlap_server, name):
    result = run_ok(overlap_server, f"{WINDOWS}:{name}")
    value = result.value
    assert value["window"] == name and value["detail"]
    assert value["hits"]["reached"] >= 1 and value["hits"]["entered"] == 1
    assert result.windows[name] == value["hits"]
    if name == "paused_in_place_busy":
        assert value["flush_success"] is False  # refused for the whole in-place pause
        assert value["output_len"] == 40  # resumed intact
    if name == "paused_retract_waiting_with_kv":
        assert value["flush_success"] is True  # 0.5.21+: flush ignores the retracted waiters
    if name == "decode_retracted_waiting":  # re-admitted, and every output is its reference's
        assert value["retracted"] >= 1 and value["outputs_compared"] == 3, value
    if name == "prefill_not_merged":  # retracted from last_batch, then resumed and finished intact
        assert value["retracted"] and value["outputs_compared"] == 1, value
    if name == "finished_not_pruned":
        assert "result_queue" in value["detail"] or "last_batch" in value["detail"] \
            or "running_batch" in value["detail"]


@pytest.mark.pp4
def test_pp_inflight_after_last_chunk_reached_on_pp4(server_pool):
    result = run_ok(server_pool.get("pp4"), f"{WINDOWS}:pp_inflight_after_last_chunk")
    value = result.value
    assert value["detail"].startswith("mbs[")
    assert value["hits"]["reached"] == 1 and value["hits"]["entered"] == 1
    # 0.5.13+ (PR 27446) checks the mbs slots: the flush is refused.
    assert value["flush_success"] is False


def test_finished_not_pruned_update_weights_refused_on_normal_loop(server_pool):
    """Issue 14062 on 0.5.22+: the update lands in the window and is answered
    with success=False instead of the old assert."""
    value = run_ok(server_pool.get("pp1-normal"), f"{WINDOWS}:finished_not_pruned").value
    assert value["detail"].startswith("running_batch=")
    assert value["processed_in_window"] is True
    assert value["update_success"] is False
    assert "cache was not flushed" in value["update_message"]


def script_wait_for_window_that_never_opens(ctx):
    yield from ctx.wait_for_window("paused_in_place_busy", max_steps=5)


def script_wait_for_unknown_window(ctx):
    yield from ctx.wait_for_window("no_such_window")


def script_pp_window_on_pp1(ctx):
    yield from ctx.wait_for_window("pp_inflight_after_last_chunk")


def test_window_never_reached_fails_with_state(overlap_server):
    result = overlap_server.run(script_wait_for_window_that_never_opens)
    assert not result.passed
    assert result.error.startswith("WaitTimeout: window 'paused_in_place_busy' (PR 10071) not reached within 5 steps")
    assert "State seen: step=5 loop=overlap" in result.error
    assert result.windows["paused_in_place_busy"]["reached"] == 0


def test_wait_for_window_rejects_unknown_and_inapplicable_windows(overlap_server):
    unknown = overlap_server.run(script_wait_for_unknown_window)
    assert "unknown window 'no_such_window'" in unknown.error and "finished_not_pruned" in unknown.error
    wrong_loop = overlap_server.run(script_pp_window_on_pp1)
    assert "cannot open on the overlap loop; it applies to: pp" in wrong_loop.error
