"""Invariants, window counting, timeline and rendering on small fakes (pure
logic; the real-scheduler behaviour is in test_invariants.py / test_windows.py)."""
from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections import deque
from types import SimpleNamespace

import pytest
import torch

from scripted_runtime.user_side import cli
from scripted_runtime.scheduler_side import invariants
from scripted_runtime.scheduler_side.invariants import InvariantChecker, StateView
from scripted_runtime.user_side import trace_render as render
from scripted_runtime import timeline
from scripted_runtime.scheduler_side.windows import Window, WindowTracker

from tests.fakes import TOTAL, FakeBatch, FakeKv, FakeReq, FakeScheduler, FakeTree  # noqa: F401


def check(s, disabled=(), memory=None):
    checker = InvariantChecker(disabled)
    if memory is not None:
        checker.memory = memory
    return checker.check(StateView(s))


def test_quiet_on_a_consistent_busy_state():
    s = FakeScheduler(reqs=[FakeReq("a", row=1, allocated=10), FakeReq("b", row=2, allocated=5)])
    assert check(s) is None


def test_idle_gate_fires_when_the_gate_says_idle_with_live_requests():
    s = FakeScheduler(idle=True, reqs=[FakeReq("a", row=1, allocated=10)])
    v = check(s)
    assert v.invariant == "idle_gate"
    assert "1 live request(s) are held: a in running_batch" in v.message
    assert v.owners == {"a": {"row": 1, "holders": ["running_batch"]}}


def test_idle_gate_ignores_finished_requests_and_plain_waiters():
    s = FakeScheduler(idle=True, reqs=[FakeReq("a", done=True)])
    s.waiting_queue = [FakeReq("w")]  # waiting without KV owns nothing
    assert check(s, disabled=["pool_accounting"]) is None


def test_slot_ownership_two_live_owners_of_one_row():
    s = FakeScheduler(reqs=[FakeReq("a", row=3), FakeReq("b", row=3)])
    v = check(s)
    assert v.invariant == "slot_ownership" and "row 3 is owned by 2 live requests: a,b" in v.message


def test_slot_ownership_duplicate_free_rows():
    s = FakeScheduler(reqs=[], free_rows=[1, 2, 2, 3])
    v = check(s)
    assert v.invariant == "slot_ownership" and "duplicate rows [2]" in v.message


def test_slot_ownership_owned_row_in_free_list():
    s = FakeScheduler(reqs=[FakeReq("a", row=4, allocated=3)], free_rows=[1, 2, 4])
    assert "row 4 of live request a is in the free list" in check(s).message


def test_slot_ownership_chunked_request_changes_row():
    req = FakeReq("c", row=5, allocated=64)
    s = FakeScheduler(reqs=[req])
    s.chunked_req = req
    memory = invariants.InvariantMemory()
    assert check(s, memory=memory) is None
    req.kv.req_pool_idx = 6  # PR 17850: released after the chunk, re-allocated elsewhere
    s.req_to_token_pool.free_slots = [i for i in range(1, 9) if i != 6]
    s.req_to_token_pool.req_to_token[6, :64] = torch.arange(64)
    v = check(s, memory=memory)
    assert v.invariant == "slot_ownership"
    assert "chunked request c moved from row 5 to row 6" in v.message


def test_slot_ownership_a_retracted_chunked_request_may_come_back_in_another_row():
    """pause(retract) and continue processed in one iteration: the retract gave
    the chunked request's row back (Req.reset_for_retract counts it) and the
    re-prefill took another, done in one chunk thanks to the cached prefix.
    Met by the explorer on pp1-overlap; a row change without a retract is
    still a violation (the test above)."""
    req = FakeReq("c", row=5, allocated=64)
    s = FakeScheduler(reqs=[req])
    s.chunked_req = req
    memory = invariants.InvariantMemory()
    assert check(s, memory=memory) is None
    req.retraction_count = 1
    req.kv.req_pool_idx = 6
    s.chunked_req = None  # left chunking: prefilled again in one chunk
    s.req_to_token_pool.free_slots = [i for i in range(1, 9) if i != 6]
    s.req_to_token_pool.req_to_token[6, :64] = torch.arange(64)
    assert check(s, memory=memory) is None
    # and without the retract the same move is reported
    req2 = FakeReq("d", row=5, allocated=64)
    s2 = FakeScheduler(reqs=[req2])
    s2.chunked_req = req2
    memory2 = invariants.InvariantMemory()
    assert check(s2, memory=memory2) is None
    req2.kv.req_pool_idx = 6
    s2.chunked_req = None
    s2.req_to_token_pool.free_slots = [i for i in range(1, 9) if i != 6]
    s2.req_to_token_pool.req_to_token[6, :64] = torch.arange(64)
    assert "request d left chunking in row 6, not its first-chunk row 5" in check(s2, memory=memory2).message


def test_slot_ownership_kv_index_of_live_row_is_free():
    s = FakeScheduler(reqs=[FakeReq("a", row=1, allocated=10)])
    s.token_to_kv_pool_allocator.free_pages = torch.cat([torch.tensor([7]), torch.arange(10, TOTAL)])
    v = check(s, disabled=["pool_accounting"])
    assert v.invariant == "slot_ownership" and "KV indices [7] of live request a (row 1)" in v.message


def test_slot_ownership_names_the_row_whose_kv_is_free_among_several():
    """Every live row is looked up in one array: the violation still names
    the row that holds the free index, not the first row checked."""
    s = FakeScheduler(reqs=[FakeReq("a", row=1, allocated=10), FakeReq("b", row=2, allocated=5),
                            FakeReq("c", row=3, allocated=4)])  # KV a 0..9, b 10..14, c 15..18
    s.token_to_kv_pool_allocator.free_pages = torch.cat([torch.tensor([12]), torch.arange(19, TOTAL)])
    v = check(s, disabled=["pool_accounting"])
    assert v.invariant == "slot_ownership" and "KV indices [12] of live request b (row 2)" in v.message
    s.token_to_kv_pool_allocator.free_pages = torch.arange(19, TOTAL)
    assert check(s, disabled=["pool_accounting"]) is None


def test_slot_ownership_sees_free_list_changes_across_iterations_of_one_run():
    """The free-row set is cached between iterations; every way SGLang (or a
    bug) changes the list must still be seen: a double free appending in
    place, a live row written over a free one in place, a new list."""
    req = FakeReq("a", row=4, allocated=3)
    s = FakeScheduler(reqs=[req])
    memory = invariants.InvariantMemory()
    assert check(s, memory=memory) is None
    assert check(s, memory=memory) is None  # unchanged list: served from the cache
    free = s.req_to_token_pool.free_slots
    free.append(free[0])  # double free, same list object
    assert "duplicate rows" in check(s, memory=memory).message
    free.pop()
    assert check(s, memory=memory) is None
    free[0] = 4  # the live row overwrites a free one, same length
    assert "row 4 of live request a is in the free list" in check(s, memory=memory).message
    s.req_to_token_pool.free_slots = [1, 2, 3]  # alloc slices a new list
    assert check(s, memory=memory) is None


def test_slot_ownership_follows_kv_free_list_changes_across_iterations_of_one_run():
    """The free-KV counts are kept between iterations and updated from what
    changed: an alloc (a suffix view of the same tensor) uncounts only its
    prefix; a free (a new tensor from torch.cat) recounts. Every change must
    still be seen, including an index freed twice, once in each part."""
    req = FakeReq("a", row=1, allocated=10)  # KV 0..9
    s = FakeScheduler(reqs=[req])
    alloc = s.token_to_kv_pool_allocator
    memory = invariants.InvariantMemory()
    check_ = lambda: check(s, disabled=["pool_accounting"], memory=memory)  # noqa: E731
    assert check_() is None
    # decode: the request takes index 10 (alloc pops the head of free_pages)
    taken, alloc.free_pages = alloc.free_pages[:1], alloc.free_pages[1:]
    req.kv.kv_allocated_len = 11
    s.req_to_token_pool.req_to_token[1, 10] = int(taken)
    assert check_() is None
    assert memory.free_kv.counts[10] == 0 and memory.free_kv.counts[11] == 1
    # a bug frees the live index 3 (free appends: a new tensor)
    alloc.free_pages = torch.cat([alloc.free_pages, torch.tensor([3])])
    v = check_()
    assert v.invariant == "slot_ownership" and "KV indices [3] of live request a" in v.message
    # the next alloc hands 11 out (a suffix view again): 3 is still free and still caught
    alloc.free_pages = alloc.free_pages[1:]
    assert "KV indices [3]" in check_().message
    # index 5 freed twice, once in each part; one alloc of it leaves it free in the other
    alloc.free_pages = torch.cat([torch.tensor([5]), torch.arange(12, TOTAL)])
    alloc.release_pages = torch.tensor([5])
    assert "KV indices [5]" in check_().message
    alloc.free_pages = alloc.free_pages[1:]
    assert "KV indices [5]" in check_().message
    alloc.release_pages = torch.empty(0, dtype=torch.int64)  # merged away
    assert check_() is None


def test_slot_ownership_kv_index_beyond_the_pool_size_is_still_checked():
    s = FakeScheduler(reqs=[FakeReq("a", row=1, allocated=10)])
    s.req_to_token_pool.req_to_token[1, 0] = TOTAL + 50  # past size + a page: the mask grows
    s.token_to_kv_pool_allocator.free_pages = torch.cat([torch.tensor([TOTAL + 50]), torch.arange(10, TOTAL)])
    v = check(s, disabled=["pool_accounting"])
    assert v.invariant == "slot_ownership" and f"KV indices [{TOTAL + 50}] of live request a" in v.message


def test_pool_accounting_busy_and_idle_forms():
    s = FakeScheduler(reqs=[FakeReq("a", row=1, allocated=10, protected=4)], evictable=3, protected=4)
    # available 83 + evictable 3 + protected 4 + uncached (10 - 4) = 96 != 100
    v = check(s)
    assert v.invariant == "pool_accounting" and "= 96 != total 100" in v.message
    balanced = FakeScheduler(reqs=[FakeReq("a", row=1, allocated=10, protected=4)], evictable=3)
    balanced.tree_cache._protected = 4
    balanced.token_to_kv_pool_allocator.free_pages = torch.arange(13, TOTAL - 0)[:87]
    assert check(balanced) is None
    idle = FakeScheduler(idle=True, reqs=[], free_kv=torch.arange(0, 95), evictable=0)
    assert "leaked 5 tokens" in check(idle).message
    assert check(FakeScheduler(idle=True, reqs=[], free_kv=torch.arange(0, 95)), disabled=["pool_accounting"]) is None


def test_unknown_invariant_name_is_rejected():
    with pytest.raises(ValueError, match="unknown invariant.*slot_owner.*known: idle_gate"):
        InvariantChecker(["slot_owner"])


def test_window_tracker_counts_reached_open_and_entered():
    flag = {"open": False}
    tracker = WindowTracker({"w": Window("w", ("overlap",), "test", "doc",
                                         lambda s: "d" if flag["open"] else None)})
    sequence = [False, True, True, False, True, False]
    for value in sequence:
        flag["open"] = value
        tracker.observe(None, "overlap")
    tracker.mark_entered("w")
    assert tracker.report() == {"w": {"reached": 2, "open_steps": 3, "entered": 1}}
    tracker.observe(None, "normal")  # not applicable on this loop: never open
    assert tracker.open == {}


def _sample_records():
    return [
        {"step": 0, "slot": None, "batches": {}, "waiting": [], "rows": {}, "rows_free": 8, "rows_total": 8,
         "kv_free": 100, "kv_total": 100, "tree_nodes": 0, "tree_locked": 0, "fully_idle": True,
         "launched": [], "answers": [], "windows": {}, "windows_opened": [], "entered": [],
         "ops": [], "violation": None},
        {"step": 1, "slot": None, "batches": {"last_batch": {"mode": "extend", "rids": ["a"]},
                                              "result_queue[0]": {"mode": "extend", "rids": ["a"]}},
         "chunked": "a", "waiting": ["b"], "rows": {"a": 1}, "rows_free": 7, "rows_total": 8,
         "kv_free": 36, "kv_total": 100, "tree_nodes": 1, "tree_locked": 1, "fully_idle": False,
         "launched": [{"slot": None, "mode": "extend", "rids": ["a"]}],
         "answers": [{"op": "flush_cache", "success": False, "message": "busy"}],
         "windows": {"chunked_between_chunks": "a@row1"}, "windows_opened": ["chunked_between_chunks"],
         "entered": ["chunked_between_chunks"], "ops": [{"op": "flush_cache"}],
         "violation": {"invariant": "slot_ownership", "message": "m", "owners": {}, "step": 1}},
    ]


def test_timeline_lines():
    lines = timeline.format_timeline(_sample_records(), header={"script": "s", "loop": "overlap"}).splitlines()
    assert lines[0].startswith("trace of s on overlap loop")
    assert lines[1] == "      0      idle | rows 0 kv 0 tree 0n/0L"
    assert lines[2] == (">>    1      last:E[a] rq0:E[a] chk:a wait:[b] | rows 1 kv 64 tree 1n/1L | "
                        "=flush_cache:REFUSED {chunked_between_chunks} @chunked_between_chunks "
                        "+flush_cache !!slot_ownership")


def test_trace_files_round_trip_through_the_cli(tmp_path, capsys):
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(json.dumps(o) for o in [{"trace_format": 1, "script": "s", "loop": "overlap",
                                                        "pp_size": 1, "invariants": ["idle_gate"]}]
                              + _sample_records()) + "\n")
    assert cli.main(["trace", "show", str(path), "--last", "1"]) == 0
    out = capsys.readouterr().out
    assert "1 earlier steps not shown" in out and "!!slot_ownership" in out
    svg = tmp_path / "t.svg"
    assert cli.main(["trace", "render", str(path), "-o", str(svg)]) == 0
    root = ET.parse(svg).getroot()
    texts = [e.text for e in root.iter("{http://www.w3.org/2000/svg}text")]
    assert "!! slot_ownership (step 1)" in texts and "row 1" in texts and "1: flush_cache" in texts
    page = tmp_path / "t.html"
    assert cli.main(["trace", "render", str(path), "-o", str(page)]) == 0
    assert "<svg" in page.read_text() and "!!slot_ownership" in page.read_text()


def test_trace_cli_errors_are_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n")
    assert cli.main(["trace", "show", str(bad)]) == 2
    assert "bad.jsonl:1: not a JSON line" in capsys.readouterr().err
    assert cli.main(["trace", "render", str(bad), "-o", str(tmp_path / "x.pdf")]) == 2
    assert "-o must end in .svg, .html or .png" in capsys.readouterr().err
    with pytest.raises(ValueError, match="no steps to draw"):
        render.render_svg({}, [])


def test_an_admitted_request_must_hold_a_lock_on_its_matched_prefix():
    """SGLang's PrefillAdder locks an admitted request's matched prefix (its
    last_node) and a checkpoint moves the lock: a running request whose
    prefix node has lock ref 0 reads KV that eviction may free under it. A
    waiting request has matched but locked nothing yet; the root is never
    judged."""
    from types import SimpleNamespace

    from scripted_runtime.scheduler_side import invariants as inv
    from tests.fakes import FakeBatch, FakeReq, FakeScheduler

    def judged(lock_ref, *, waiting=False, at_root=False):
        s = FakeScheduler(idle=False)
        node = SimpleNamespace(id=7, lock_ref=lock_ref, children={}, parent=s.tree_cache.root_node)
        s.tree_cache.root_node.children = {"k": node}
        r = FakeReq("a", row=0, allocated=8)
        r.last_node = s.tree_cache.root_node if at_root else node
        if waiting:
            s.waiting_queue = [r]
        else:
            s.running_batch = FakeBatch([r])
        return inv.check_radix_locks(inv.StateView(s), inv.InvariantMemory())

    assert judged(1) is None
    bad = judged(0)
    assert bad is not None and "admitted request a reads the prefix up to tree node #7, which is not locked" in bad.message
    assert judged(0, waiting=True) is None
    assert judged(0, at_root=True) is None
