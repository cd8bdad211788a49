"""Each per-iteration invariant fires on a deliberately broken state of the
real scheduler (the scripts break it, and undo the damage in ``finally``,
which runs when the harness closes the failed script), names itself, the
step and the owners, and shows the last steps of the trace. The foundation
tests run with every invariant on and stay quiet."""
from __future__ import annotations

from pathlib import Path

import pytest

from scripted_runtime.scheduler_side import invariants
from scripted_runtime import timeline
from tests.helpers import run_ok

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def overlap_server(server_pool):
    return server_pool.get("pp1-overlap")


# --- idle gate -------------------------------------------------------------------

def script_weak_idle_gate(ctx):
    """Replace is_fully_idle with the weak check that ignores last_batch and
    result_queue (the upstream script context's mistake)."""
    s = ctx.scheduler
    s.is_fully_idle = lambda *a, **k: s.running_batch.is_empty() and s.chunked_req is None \
        and len(s.waiting_queue) == 0
    try:
        ctx.start_req(prompt_len=16, max_new_tokens=8, ignore_eos=True)
        yield from ctx.steps(10)
    finally:
        del s.is_fully_idle


def test_idle_gate_fires_when_the_idle_check_misses_in_flight_batches(overlap_server):
    result = overlap_server.run(script_weak_idle_gate)
    assert not result.passed
    assert result.violation["invariant"] == "idle_gate"
    assert result.error.startswith("InvariantViolation[idle_gate] at step 1:")
    assert "is_fully_idle() says idle but 1 live request(s) are held" in result.error
    assert "last_batch" in result.error and "result_queue[0]" in result.error
    assert result.timeline.splitlines()[-1].startswith(">>    1 ") and "!!idle_gate" in result.timeline
    run_ok(overlap_server, "scenarios/demo.py:chunked_then_decode")  # the server is fine after


def script_pp_idle_gate_ignoring_mbs(ctx):
    """The PR 27446 bug, re-created: after a first request ran normally, the
    PP drain check is made to ignore the mbs slots; the next 2-chunk prompt
    opens the window in which that gate wrongly says idle."""
    first = ctx.start_req(prompt_len=16, max_new_tokens=3, ignore_eos=True)
    yield from ctx.wait_finished(first, max_steps=100)
    s = ctx.scheduler
    s._pp_microbatches_drained = lambda: all(x.is_empty() for x in s.running_mbs)
    try:
        ctx.start_req(prompt_len=100, max_new_tokens=4, ignore_eos=True)
        yield from ctx.steps(40)
    finally:
        del s._pp_microbatches_drained


@pytest.mark.pp4
def test_idle_gate_catches_the_pr27446_window_on_pp4(server_pool):
    result = server_pool.get("pp4").run(script_pp_idle_gate_ignoring_mbs)
    assert result.violation is not None, result.summary()
    assert result.violation["invariant"] == "idle_gate"
    assert any("mbs[" in h for o in result.violation["owners"].values() for h in o["holders"])


# --- slot ownership ----------------------------------------------------------------

def script_free_a_live_row(ctx):
    r = ctx.start_req(prompt_len=10, max_new_tokens=40, ignore_eos=True)
    yield from ctx.wait_until(lambda: r.req_pool_idx is not None, max_steps=20, what="a row")
    pool = ctx.scheduler.req_to_token_pool
    row = r.req_pool_idx
    pool.free_slots.append(row)  # the row is now both owned and free
    try:
        yield from ctx.steps(5)
    finally:
        pool.free_slots.remove(row)


def test_slot_ownership_fires_on_a_freed_live_row(overlap_server):
    result = overlap_server.run(script_free_a_live_row)
    assert result.violation["invariant"] == "slot_ownership"
    assert "of live request" in result.error and "is in the free list" in result.error
    (rid, owner), = result.violation["owners"].items()
    assert owner["row"] is not None and "owners: " + rid in result.error


# --- radix locks --------------------------------------------------------------------

def script_stale_node(ctx):
    r = ctx.start_req(prompt_len=16, max_new_tokens=40, ignore_eos=True)
    yield from ctx.wait_until(lambda: r.status == "running" and r.req.last_node is not None,
                              max_steps=20, what="a request holding a tree node")
    req = r.req
    saved = req.last_node
    req.last_node = 10**9  # a node id from a tree that no longer exists
    try:
        yield from ctx.steps(5)
    finally:
        req.last_node = saved


def script_lock_left_at_idle(ctx):
    r = ctx.start_req(prompt_len=16, max_new_tokens=2, ignore_eos=True)
    yield from ctx.wait_finished(r)
    yield from ctx.wait_idle()
    tree = ctx.scheduler.tree_cache
    node_id = next(iter(ctx.get_all_node_lock_refs()))
    from scripted_runtime.scheduler_side.context import radix

    node = radix.resolve(tree, node_id)
    data = node.component_data[0] if getattr(node, "component_data", None) else node
    data.lock_ref += 1
    try:
        yield
    finally:
        data.lock_ref -= 1


def test_radix_locks_fires_on_a_node_outside_the_tree(overlap_server):
    result = overlap_server.run(script_stale_node)
    assert result.violation["invariant"] == "radix_locks"
    assert "holds tree node #1000000000 that is not in the current tree" in result.error


def test_radix_locks_fires_on_a_lock_left_at_idle(overlap_server):
    result = overlap_server.run(script_lock_left_at_idle)
    assert result.violation["invariant"] == "radix_locks"
    assert "idle, yet 1 tree node(s) still locked" in result.error


# --- pool accounting ----------------------------------------------------------------

def script_leak_kv(ctx):
    allocator = ctx.scheduler.token_to_kv_pool_allocator
    held = allocator.alloc(5)  # taken behind the harness's back (not ctx.exhaust_kv)
    try:
        yield
    finally:
        allocator.free(held)


def script_exhaust_kv_is_accounted(ctx):
    ctx.exhaust_kv(leave_pages=100)
    r = ctx.start_req(prompt_len=16, max_new_tokens=4, ignore_eos=True)
    yield from ctx.wait_finished(r)
    yield from ctx.steps(3)


def test_pool_accounting_fires_on_leaked_tokens_before_sglang_notices(overlap_server):
    result = overlap_server.run(script_leak_kv)
    assert not result.crashed, "SGLang's own on_idle leak check fired first"
    assert result.violation["invariant"] == "pool_accounting"
    assert "leaked 5 tokens" in result.error
    run_ok(overlap_server, "scenarios/demo.py:chunked_then_decode")


def test_pool_accounting_counts_kv_held_by_exhaust_kv(overlap_server):
    run_ok(overlap_server, script_exhaust_kv_is_accounted)


def test_kv_pressure_leaves_a_chunked_prompt_the_room_admission_counted(server_pool):
    """The explorer's KV pressure takes what SGLang did not reserve: a prompt
    mid-prefill keeps room for its later chunks (the old room rule crashed
    SGLang here: "Out of memory" in alloc_for_extend, scenarios/kv_pressure.py)."""
    value = run_ok(server_pool.get("pp1-normal"), f"{ROOT}/scenarios/kv_pressure.py:exhaust_kv_while_chunking").value
    assert value["taken"] > 7000, value  # the pressure was real: nearly the whole pool taken
    assert value["outputs_compared"] == 2, value


@pytest.mark.pp4
def test_kv_pressure_under_pp_is_taken_on_every_rank_alike(server_pool):
    """Under PP the harness's take rides SGLang's request relay to every
    rank (scheduler_side/rank_ops.py): each leaves the same room, so the
    ranks keep agreeing on what fits; the chunked prompt still gets its
    later chunks, nothing crashes and both outputs are their references'."""
    value = run_ok(server_pool.get("pp4"), f"{ROOT}/scenarios/kv_pressure.py:exhaust_kv_while_chunking").value
    assert value["taken"] > 7000 and value["outputs_compared"] == 2, value


# --- switching off, and the trace of a violation ---------------------------------------

def test_an_invariant_can_be_switched_off(overlap_server):
    others = [n for n in invariants.NAMES if n != "slot_ownership"]
    assert overlap_server.run(script_free_a_live_row, invariants=others).passed
    assert overlap_server.run(script_free_a_live_row, invariants=False).passed
    with pytest.raises(ValueError, match="unknown invariant"):
        overlap_server.run(script_free_a_live_row, invariants=["slot_owner"])


def test_violation_trace_marks_the_step(overlap_server, tmp_path):
    path = tmp_path / "violation.jsonl"
    result = overlap_server.run(script_free_a_live_row, trace=path)
    assert result.trace_path == str(path)
    header, records = timeline.load(str(path))
    assert header["invariants"] == list(invariants.NAMES)
    broken = [r for r in records if r["violation"]]
    assert len(broken) == 1 and broken[0] is records[-1]
    assert broken[0]["violation"]["invariant"] == "slot_ownership"
    assert broken[0]["rows"], "the record shows which rows were owned"
