"""The invariants' tensor code on the device the pools live on.

On a GPU runner SGLang keeps ``req_to_token`` and the allocator's free lists
on the GPU, and the checks take other paths there than on CPU: a device row
is copied to the host each time (no numpy view kept), the free parts are
copied once per rebuild, and the suffix-view shortcut of ``KvFreeCounts``
compares device addresses. The same small fakes as ``tests/logic/test_invariants.py``
run here on CPU (default lane) and on CUDA (``gpu`` lane:
``pytest --device cuda``), so both paths are held to the same verdicts.
"""
from __future__ import annotations

import pytest
import torch

from scripted_runtime.hooks import sglang_compat
from scripted_runtime.scheduler_side import invariants
from tests.logic.test_invariants import TOTAL, FakeReq, FakeScheduler, check

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def on_device(s: FakeScheduler, device: str) -> FakeScheduler:
    """Move the fake's pools where SGLang would keep them on this device."""
    pool, alloc = s.req_to_token_pool, s.token_to_kv_pool_allocator
    pool.req_to_token = pool.req_to_token.to(device)
    alloc.free_pages = alloc.free_pages.to(device)
    alloc.release_pages = alloc.release_pages.to(device)
    return s


@pytest.mark.parametrize("device", DEVICES)
def test_consistent_busy_state_is_quiet_on_the_device(device):
    s = on_device(FakeScheduler(reqs=[FakeReq("a", row=1, allocated=10), FakeReq("b", row=2, allocated=5)]), device)
    assert s.req_to_token_pool.req_to_token.device.type == device
    assert check(s) is None


@pytest.mark.parametrize("device", DEVICES)
def test_kv_free_list_changes_are_followed_on_the_device(device):
    """What the CPU test of the incremental count does, with device tensors:
    an alloc (suffix view) uncounts its prefix, a free (torch.cat) recounts,
    an index freed in both parts stays caught after one of them is taken."""
    req = FakeReq("a", row=1, allocated=10)  # KV 0..9
    s = on_device(FakeScheduler(reqs=[req]), device)
    alloc, table = s.token_to_kv_pool_allocator, s.req_to_token_pool.req_to_token
    memory = invariants.InvariantMemory()
    check_ = lambda: check(s, disabled=["pool_accounting"], memory=memory)  # noqa: E731
    assert check_() is None
    taken, alloc.free_pages = alloc.free_pages[:1], alloc.free_pages[1:]  # decode: a suffix view
    req.kv.kv_allocated_len = 11
    table[1, 10] = taken  # written in place on the device, as prepare_for_decode does
    assert check_() is None
    assert memory.free_kv.counts[10] == 0 and memory.free_kv.counts[11] == 1
    alloc.free_pages = torch.cat([alloc.free_pages, torch.tensor([3], device=device)])  # a bug frees live 3
    assert "KV indices [3] of live request a" in check_().message
    alloc.free_pages = alloc.free_pages[1:]
    assert "KV indices [3]" in check_().message
    alloc.free_pages = torch.cat([torch.tensor([5], device=device), torch.arange(12, TOTAL, device=device)])
    alloc.release_pages = torch.tensor([5], device=device)
    assert "KV indices [5]" in check_().message
    alloc.free_pages = alloc.free_pages[1:]
    assert "KV indices [5]" in check_().message
    alloc.release_pages = torch.empty(0, dtype=torch.int64, device=device)
    assert check_() is None


@pytest.mark.parametrize("device", DEVICES)
def test_a_row_rewritten_in_place_is_read_again_on_the_device(device):
    """The row table is one tensor for the server's life; a row written in
    place (a second request handed the row's KV) must be read afresh, not
    from a copy taken at an earlier iteration."""
    req = FakeReq("a", row=2, allocated=4)  # KV 0..3
    s = on_device(FakeScheduler(reqs=[req]), device)
    memory = invariants.InvariantMemory()
    assert check(s, disabled=["pool_accounting"], memory=memory) is None
    s.req_to_token_pool.req_to_token[2, 1] = 40  # 40 is in the free list
    v = check(s, disabled=["pool_accounting"], memory=memory)
    assert v.invariant == "slot_ownership" and "KV indices [40] of live request a (row 2)" in v.message


@pytest.mark.parametrize("device", DEVICES)
def test_paged_free_lists_are_expanded_on_the_device(device):
    """page_size 2: the allocator holds page numbers; a live token in a free
    page is caught, and the expansion stays on the pools' device."""
    req = FakeReq("a", row=1, allocated=4)  # tokens 0..3 = pages 0 and 1
    s = on_device(FakeScheduler(reqs=[req]), device)
    alloc = s.token_to_kv_pool_allocator
    alloc.page_size = 2
    alloc.free_pages = torch.arange(2, TOTAL // 2, device=device)  # pages 2.. free
    parts = sglang_compat.allocator_free_index_parts(alloc)
    assert parts[0].device.type == device and parts[0][:4].tolist() == [4, 5, 6, 7]
    assert check(s, disabled=["pool_accounting"]) is None
    alloc.free_pages = torch.cat([torch.tensor([1], device=device), alloc.free_pages])  # page 1 freed under a
    v = check(s, disabled=["pool_accounting"])
    assert v.invariant == "slot_ownership" and "KV indices [2, 3] of live request a" in v.message
