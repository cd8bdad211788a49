"""Mutants of KV content and slot mapping: the number of KV slots each
request holds stays right, but what a request's ``req_to_token`` row (or
the batch's row tensors) points at is wrong, so a forward reads KV that is
not its own. Written blind (issue 34, item 5): the harness's checks were not
read, so ``expected`` is a guess of what should notice the bug."""
from __future__ import annotations

from typing import Any

from scripted_runtime.hooks.mutants.base import (ALL, SCHEDULE_BATCH, UNIFIED_RADIX_CACHE, mutant, find_attr,
                                                 find_method, find_module, replace_attr, scheduler_class)

# The per-row tensors of a ScheduleBatch that ``merge_batch`` concatenates
# (the request's row, its length and its mirrors), in the batch's order.
ROW_TENSORS = ("req_pool_indices", "req_pool_indices_cpu", "seq_lens", "seq_lens_cpu", "orig_seq_lens")


# --- merge_batch: the row tensors in the other order ------------------------------


@mutant("mut_merge_batch_rows_other_first", topologies=ALL,
        summary="merge_batch concatenates the row tensors (rows, seq lens) other-first while reqs stay self-first",
        expected="unknown (written blind); should show as wrong outputs (requests decode in each other's "
                 "rows), then a crash or leak once one of them finishes")
def _install_mut_merge_batch_rows_other_first(scheduler_module: Any) -> None:
    """``ScheduleBatch.merge_batch`` builds ``reqs`` as ``self.reqs +
    other.reqs`` but concatenates the row tensors (``req_pool_indices`` and
    its CPU mirror, ``seq_lens`` and its mirrors) as ``[other, self]``: after
    a prefill batch joins a non-empty running batch, the request at position
    k decodes on the row and length of another request. Each row still gets
    exactly one new KV slot per step, so the slot counts stay right while
    every request attends over another request's KV (its logits, hence its
    next token, come from that context); once one of them finishes, its own
    row is released while another position still writes into it.

    Plausible: a two-line ``torch.cat([other.x, self.x])`` in a method whose
    list half (``reqs``, logprob lists) is written the other way round; with
    one side empty (the only merge the server's warm-up could do) the order
    does not matter, and the running batch is never merged when empty.

    Trigger: a request admitted while another one is decoding (its prefill
    batch merged into a non-empty running batch), both then decoding.

    Seen by (written blind): the greedy outputs of both requests differ from
    the same prompts run alone; later, a release frees a row another
    position still uses (KV slots leaked or freed twice). All topologies."""
    mutant = "mut_merge_batch_rows_other_first"
    scheduler_class(scheduler_module, mutant)
    batch_cls = find_attr(find_module(SCHEDULE_BATCH, mutant), "ScheduleBatch", mutant,
                          f"{SCHEDULE_BATCH}.ScheduleBatch")
    original = find_method(batch_cls, "merge_batch", mutant, ("other",))
    import torch

    def merge_batch(self, other):
        n_self, n_other = len(self.reqs), len(other.reqs)
        result = original(self, other)
        if n_self and n_other:
            for name in ROW_TENSORS:
                rows = getattr(self, name, None)
                if rows is not None and len(rows) == n_self + n_other:
                    # MUTANT: was torch.cat([self.x, other.x]); reqs stay self + other
                    setattr(self, name, torch.cat([rows[n_self:], rows[:n_self]]))
        return result

    replace_attr(batch_cls, "merge_batch", merge_batch, original)


# --- checkpoint: the row is not rebound to the tree's copy ------------------------


@mutant("mut_checkpoint_row_keeps_duplicate_slots", topologies=ALL,
        summary="after a checkpoint finds its prefix already cached, the row keeps the duplicate slots it just freed",
        expected="unknown (written blind); should show as wrong outputs (a request reads KV slots that were "
                 "freed and handed to another request)")
def _install_mut_checkpoint_row_keeps_duplicate_slots(scheduler_module: Any) -> None:
    """``UnifiedRadixCache.checkpoint`` no longer leaves the request's
    ``req_to_token`` row pointing at the tree's copy of what it inserted.
    When the insert finds part of the request's KV already cached (another
    request computed the same prefix at the same time), it frees the
    request's duplicate slots and ``checkpoint_into_tree`` rewrites
    ``req_to_token[row, cache_protected_len:...]`` to the tree's indices;
    here that rewrite is undone, so the row keeps the freed duplicates. The
    protected length still moves past them, so the request never frees them
    again: the slot counts balance, the content does not. The next
    allocations (this request's own next decode slot among them) reuse those
    slots and overwrite KV the request still attends over.

    Plausible: the rebind looks redundant ("the row already holds this
    request's KV") unless one remembers the duplicates the insert freed; a
    refactor that moves it under ``if the insert created new nodes`` drops
    it exactly where it matters. The warm-up request has no duplicate (its
    row already equals the tree's copy), so nothing changes for it.

    Trigger: two requests sharing a prompt prefix prefilled before either
    one's insert (same prefill batch, or overlapping batches), the second
    one then decoding while new KV is allocated.

    Seen by (written blind): the greedy output of the second request differs
    from its prompt run alone once a freed duplicate is reused; no slot is
    leaked or freed twice. All topologies."""
    mutant = "mut_checkpoint_row_keeps_duplicate_slots"
    scheduler_class(scheduler_module, mutant)
    cache_cls = find_attr(find_module(UNIFIED_RADIX_CACHE, mutant), "UnifiedRadixCache", mutant,
                          f"{UNIFIED_RADIX_CACHE}.UnifiedRadixCache")
    original = find_method(cache_cls, "checkpoint", mutant, ("req", "up_to"))
    find_method(cache_cls, "checkpoint_into_tree", mutant, ("req", "up_to"))

    def checkpoint(self, req, *, up_to, **kwargs):
        kv = req.kv
        start = kv.cache_protected_len if kv.holds_kv else None
        saved = None
        if start is not None and up_to > start:
            saved = self.req_to_token_pool.req_to_token[kv.req_pool_idx, start:up_to].clone()
        result = original(self, req, up_to=up_to, **kwargs)
        if saved is not None and req.kv is kv and kv.holds_kv:
            end = min(kv.cache_protected_len, up_to)
            if end > start:
                # MUTANT: the rebind `req_to_token[row, protected:len(new_indices)] = new_indices[...]` is undone
                self.req_to_token_pool.write((kv.req_pool_idx, slice(start, end)), saved[: end - start])
        return result

    replace_attr(cache_cls, "checkpoint", checkpoint, original)
