"""The HiCache transfer gate (``hooks/hicache_gate.py``) and the HiCache
checks (``scheduler_side/hicache_checks.py``) on small fakes: what holding
defers, what a consumer's wait and a release do, and what each check says
about a state that breaks it (and says nothing about one that does not).
The same checks on a real server, and the mutants they kill, are in
``tests/server/test_hicache_cpu.py``."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from scripted_runtime.hooks import hicache_gate
from scripted_runtime.scheduler_side import hicache_checks


def _view(s):
    """The checks' view of one iteration: they read only its scheduler."""
    return SimpleNamespace(s=s)


def _memory(free_counts):
    """The run's memory: the checks read only its free-KV counts."""
    return SimpleNamespace(free_kv_counts=lambda s: free_counts)


@pytest.fixture
def gate(monkeypatch):
    g = hicache_gate.TransferGate()
    monkeypatch.setattr(hicache_gate, "_gate", g)
    return g


def _copy_counter():
    calls = []
    return calls, (lambda: calls.append(1))


def test_unheld_copies_run_at_submit_and_are_released(gate):
    calls, run = _copy_counter()
    t = gate.submit("load", torch.tensor([3, 4]), torch.tensor([0, 1]), run)
    assert calls == [1] and t.state == "released"
    assert gate.counts() == {"held_loads": 0, "held_backups": 0, "copied_unreleased": 0}


def test_a_held_load_copies_nothing_until_its_consumer_waits_and_stays_pending_until_released(gate):
    gate.hold(loads=True)
    calls, run = _copy_counter()
    layer_event = object()
    t = gate.submit("load", torch.tensor([3, 4]), torch.tensor([0, 1]), run, layer_event=layer_event)
    event = hicache_gate.GateEvent(t)
    assert calls == [] and t.state == "held" and not event.query()
    assert gate.counts()["held_loads"] == 1
    gate.consumer_waits(object())  # another load's event: nothing happens
    assert calls == [] and t.state == "held"
    gate.consumer_waits(layer_event)  # the forward's wait: the copy runs first (a GPU stream would wait)
    assert calls == [1] and t.state == "copied" and t.waited and not event.query()
    assert gate.release() == 1
    assert calls == [1] and t.state == "released" and event.query()
    assert not gate.holding["load"]


def test_a_held_backup_is_copied_by_a_blocking_synchronize(gate):
    gate.hold(loads=False, backups=True)
    calls, run = _copy_counter()
    t = gate.submit("backup", torch.tensor([5]), torch.tensor([9]), run)
    loads_calls, load_run = _copy_counter()
    unheld = gate.submit("load", torch.tensor([6]), torch.tensor([8]), load_run)
    assert calls == [] and t.state == "held" and loads_calls == [1] and unheld.state == "released"
    hicache_gate.GateEvent(t).synchronize()
    assert calls == [1] and t.state == "released" and t.notes[-1] == "synchronize"


def test_a_bounded_hold_ends_by_itself(gate):
    gate.tick(10)
    gate.hold(loads=True, max_iterations=3)
    calls, run = _copy_counter()
    t = gate.submit("load", torch.tensor([1]), torch.tensor([2]), run)
    gate.tick(12)
    assert t.state == "held"
    gate.tick(13)
    assert t.state == "released" and calls == [1] and t.notes[-1] == "max_iterations"
    with pytest.raises(ValueError, match="max_iterations"):
        gate.hold(max_iterations=0)


def test_reset_releases_and_stops_holding_and_reaped_transfers_are_forgotten(gate):
    gate.hold(loads=True, backups=True, max_iterations=5)
    a = gate.submit("load", torch.tensor([1]), torch.tensor([2]), lambda: None)
    b = gate.submit("backup", torch.tensor([3]), torch.tensor([4]), lambda: None)
    gate.unwaited_reads.append({"rid": "x"})
    gate.reset()
    assert a.state == b.state == "released" and gate.holding == {"load": False, "backup": False}
    assert gate.max_iterations is None and not gate.unwaited_reads
    gate.forget_reaped(lambda t: t is b)  # SGLang still has b's ack queued
    assert gate.transfers == [b]
    with pytest.raises(ValueError, match="kind"):
        gate.release("both")


def _batch(rows, lens, table):
    return SimpleNamespace(reqs=[SimpleNamespace(rid=f"r{i}") for i in range(len(rows))],
                           req_pool_indices=torch.tensor(rows), seq_lens=torch.tensor(lens),
                           req_to_token_pool=SimpleNamespace(req_to_token=table))


def test_batch_reads_are_the_rows_up_to_each_sequence_length(gate):
    table = torch.zeros(4, 8, dtype=torch.int32)
    table[1, :5] = torch.tensor([10, 11, 12, 13, 14])
    table[2, :3] = torch.tensor([20, 21, 22])
    table[2, 3:] = 13  # stale entries past the sequence: not read
    load = gate.submit("load", torch.tensor([13, 14, 22]), torch.tensor([0, 1, 2]), lambda: None)
    reads = hicache_gate._batch_reads(_batch([1, 2], [5, 3], table), [load])
    assert [(rid, hit.tolist()) for _, rid, hit in reads] == [("r0", [13, 14]), ("r1", [22])]
    assert hicache_gate._batch_reads(_batch([2], [2], table), [load]) == []


def test_load_before_read_reports_the_forward_and_clears(gate):
    assert hicache_checks.check_load_before_read(_view(None), _memory(None)) is None
    gate.unwaited_reads += [{"transfer": 3, "rid": "r7", "mode": "extend", "slots": [95, 96], "n_slots": 85,
                             "consumer_index": 0}, {"transfer": 3, "rid": "r7", "mode": "decode", "slots": [95],
                                                    "n_slots": 85, "consumer_index": 0}]
    msg = hicache_checks.check_load_before_read(_view(None), _memory(None)).message
    assert "extend forward read 85 KV slot(s) [95, 96] of request r7" in msg and "load #3" in msg
    assert "1 more" in msg and not gate.unwaited_reads


def _scheduler(acks=()):
    ctl = SimpleNamespace(ack_write_queue=list(acks), ack_load_queue=[], mem_pool_host=None)
    return SimpleNamespace(tree_cache=SimpleNamespace(cache_controller=ctl))


def test_transfer_slots_fire_only_for_free_slots_of_unreaped_transfers(gate):
    gate.hold(backups=True)
    t = gate.submit("backup", torch.tensor([4, 5, 6]), torch.tensor([0, 1, 2]), lambda: None)
    t.completion = SimpleNamespace(finish_event=hicache_gate.GateEvent(t))
    counts = np.zeros(16, dtype=np.int32)
    s = _scheduler()
    assert hicache_checks.check_transfer_slots(_view(s), _memory(counts)) is None  # none of its slots free
    counts[[5, 6]] = 1
    msg = hicache_checks.check_transfer_slots(_view(s), _memory(counts)).message
    assert "2 device KV slot(s) [5, 6] that backup #1 (held" in msg and "reads" in msg
    gate.release()  # released and its ack no longer queued (reaped): forgotten, not checked
    assert hicache_checks.check_transfer_slots(_view(s), _memory(counts)) is None and not gate.transfers


def test_a_released_transfer_whose_ack_is_still_queued_is_still_checked(gate):
    t = gate.submit("load", torch.tensor([2]), torch.tensor([0]), lambda: None)
    t.completion = SimpleNamespace(finish_event=object())
    s = _scheduler(acks=[SimpleNamespace(finish_event=t.completion.finish_event)])
    counts = np.zeros(8, dtype=np.int32)
    counts[2] = 1
    assert "load #1 (released" in hicache_checks.check_transfer_slots(_view(s), _memory(counts)).message


def _node(host_value=None, children=()):
    from sglang.srt.mem_cache.unified_cache.component_type import BASE_COMPONENT_TYPE

    data = [SimpleNamespace(host_value=None) for _ in range(int(BASE_COMPONENT_TYPE) + 1)]
    data[BASE_COMPONENT_TYPE] = SimpleNamespace(host_value=host_value)
    return SimpleNamespace(component_data=data, children={i: c for i, c in enumerate(children)})


def _host_scheduler(used, *nodes):
    slot_used = torch.zeros(10, dtype=torch.bool)
    slot_used[list(used)] = True
    host = SimpleNamespace(slot_used=slot_used)
    ctl = SimpleNamespace(mem_pool_host=SimpleNamespace(anchor_entry=SimpleNamespace(host_pool=host)))
    root = _node(children=nodes)
    return SimpleNamespace(tree_cache=SimpleNamespace(cache_controller=ctl, enable_storage=False,
                                                      tree_core=SimpleNamespace(root_node=root)))


def test_host_accounting_holds_when_every_used_slot_is_one_nodes():
    s = _host_scheduler([1, 2, 3], _node(torch.tensor([1, 2]), children=[_node(torch.tensor([3]))]))
    assert hicache_checks.check_host_accounting(_view(s), _memory(None)) is None


def test_host_accounting_names_a_leak_a_freed_slot_and_a_shared_one():
    leak = _host_scheduler([1, 2, 3, 7], _node(torch.tensor([1, 2, 3])))
    assert "4 slots allocated but the tree holds 3 (+1: leaked)" in hicache_checks.check_host_accounting(
        _view(leak), _memory(None)).message
    freed = _host_scheduler([1], _node(torch.tensor([1, 2])))
    assert "host slot(s) [2] held by tree nodes are free" in hicache_checks.check_host_accounting(
        _view(freed), _memory(None)).message
    shared = _host_scheduler([1, 2], _node(torch.tensor([1, 2]), children=[_node(torch.tensor([2]))]))
    assert "held by two tree nodes" in hicache_checks.check_host_accounting(_view(shared), _memory(None)).message


def test_the_record_stays_bounded_where_nothing_forgets_reaped_transfers(gate):
    gate.hold(loads=True)
    held = gate.submit("load", torch.tensor([1]), torch.tensor([1]), lambda: None)
    gate.hold(loads=False)
    for i in range(hicache_gate.MAX_RECORDED * 3):
        gate.submit("load", torch.tensor([i]), torch.tensor([i]), lambda: None)
    assert len(gate.transfers) <= hicache_gate.MAX_RECORDED
    assert held in gate.transfers  # what is still pending is never dropped
    assert gate.transfers[-1].seq == hicache_gate.MAX_RECORDED * 3 + 1  # the newest released ones are kept
