"""Small stand-ins for SGLang's scheduler, requests, batches and radix tree:
just the attributes the invariants and contracts read (pure-logic tests)."""
from __future__ import annotations

from collections import deque
from types import SimpleNamespace

import torch

TOTAL = 100


class FakeKv:
    def __init__(self, row, allocated=0, protected=0):
        self.req_pool_idx = row
        self.kv_allocated_len = allocated
        self.cache_protected_len = protected
        self.kv_committed_len = allocated

    @property
    def holds_kv(self):
        return self.req_pool_idx is not None


class FakeReq:
    def __init__(self, rid, row=None, allocated=0, protected=0, done=False):
        self.rid = rid
        self.kv = FakeKv(row, allocated, protected)
        self.done = done
        self.last_node = None
        self.output_ids = []

    def finished(self):
        return self.done


class FakeBatch:
    def __init__(self, reqs, mode="decode"):
        self.reqs = list(reqs)
        self.forward_mode = SimpleNamespace(name=mode.upper(), is_extend=lambda: mode == "extend",
                                            is_decode=lambda: mode == "decode")

    def is_empty(self):
        return not self.reqs


class FakeTree:
    def __init__(self, evictable=0, protected=0):
        self.root_node = SimpleNamespace(children={})
        self._evictable, self._protected = evictable, protected

    def evictable_size(self):
        return self._evictable

    def protected_size(self):
        return self._protected

    def total_size(self):
        return self._evictable + self._protected


class FakeScheduler:
    """Just the attributes the invariants read; rows 1..8, KV slots 0..TOTAL-1."""

    def __init__(self, *, idle=False, reqs=(), free_rows=None, free_kv=None, evictable=0, protected=0):
        self.running_batch = FakeBatch(reqs)
        self.last_batch = None
        self.chunked_req = None
        self.waiting_queue = []
        self.result_queue = deque()
        self.enable_overlap = True
        self.max_total_num_tokens = TOTAL
        self._idle = idle
        owned = {r.kv.req_pool_idx for r in reqs}
        self.req_to_token_pool = SimpleNamespace(
            free_slots=free_rows if free_rows is not None else [i for i in range(1, 9) if i not in owned],
            req_to_token=torch.zeros((9, 128), dtype=torch.int32), size=8)
        self.req_to_token_pool.available_size = lambda: len(self.req_to_token_pool.free_slots)
        used = 0
        for r in reqs:  # give each request its own KV indices
            n = r.kv.kv_allocated_len
            if r.kv.req_pool_idx is not None and n:
                self.req_to_token_pool.req_to_token[r.kv.req_pool_idx, :n] = torch.arange(used, used + n)
                used += n
        free = free_kv if free_kv is not None else torch.arange(used + evictable + protected, TOTAL)
        self.token_to_kv_pool_allocator = SimpleNamespace(
            free_pages=free, release_pages=torch.empty(0, dtype=torch.int64), page_size=1, size=TOTAL,
            available_size=lambda: len(self.token_to_kv_pool_allocator.free_pages))
        self.tree_cache = FakeTree(evictable, protected)
        self.page_size = 1

    def is_fully_idle(self, **_):
        return self._idle


def busy_scheduler() -> FakeScheduler:
    """A busy stand-in: four running requests, two waiting, a chunked prefill
    between chunks, two of six PP slots holding a batch (the abstract state's
    test and ``bench/abstract_state_cost.py``)."""
    reqs = [FakeReq(f"r{i}", row=i + 1, allocated=8) for i in range(4)]
    s = FakeScheduler(reqs=reqs, evictable=30)
    s.waiting_queue = [FakeReq("w1"), FakeReq("w2")]
    s.chunked_req = FakeReq("c", row=7, allocated=64)
    s.mbs = [None, FakeBatch([reqs[0]]), None, FakeBatch([reqs[1]], mode="extend"), None, None]
    return s
