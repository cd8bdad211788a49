"""Mutants of the radix tree's lock refs: a request's lock moved by a
checkpoint, released by a release without checkpoint, and taken on its
matched prefix at admission. ``mut_admission_skips_prefix_lock`` was written
blind as a second set (issue 34): the harness's checks and what its explorer
draws were not read, and it was measured as an external patch before anyone
read it, so its ``expected`` is a guess of what should notice the bug."""
from __future__ import annotations

import inspect
import sys
from typing import Any

from scripted_runtime.hooks.mutants.base import (ALL, MEM_CACHE_COMMON, SCHEDULE_POLICY, UNIFIED_RADIX_CACHE,
                                                 check_copied_body, mutant, find_attr, find_method, missing_target,
                                                 find_module, replace_attr, scheduler_class)

# Digest of the 0.5.23 body that mut_admission_skips_prefix_lock copies
# (normalized source: dedented, blank lines dropped, trailing space stripped).
COMMIT_PREFILL_ADMISSION_DIGEST = "57d5d852d30a5fe7"


# --- radix lock refs: the checkpoint does not unlock the old node -----------------


@mutant("mut_checkpoint_keeps_old_lock", topologies=ALL,
        summary="a checkpoint into the radix tree locks the new node without unlocking the old one",
        expected="invariant radix_locks (locked nodes at idle), end-state check (tokens still protected)")
def _install_mut_checkpoint_keeps_old_lock(scheduler_module: Any) -> None:
    """``UnifiedRadixCache.checkpoint_into_tree`` takes the lock on the node
    its insert ended on but no longer releases the request's previous lock
    (the ``dec_lock_ref`` of ``self.unlock(req.lock)`` is skipped): every
    checkpoint of a request whose lock is on a non-root node leaks one lock
    ref on that path. That is the finish of a request that matched a cached
    prefix, and every chunk after the first of a chunked prompt (0.5.23's
    form of cache_unfinished_req / cache_finished_req).

    Plausible: the lock move is "unlock old, lock new"; a change that
    reorders or conditions it (e.g. only unlock when the node changed, with
    the wrong comparison) drops the first half. A request whose lock is on
    the root (no prefix hit: the warm-up request) leaks nothing visible.

    Seen by: invariant radix_locks at the first idle iteration ("idle, yet N
    tree node(s) still locked"), and the end-state check (tree tokens still
    protected). SGLang's own idle check counts protected tokens as accounted,
    so it stays silent. All topologies."""
    mutant = "mut_checkpoint_keeps_old_lock"
    scheduler_class(scheduler_module, mutant)
    cache_cls = find_attr(find_module(UNIFIED_RADIX_CACHE, mutant), "UnifiedRadixCache", mutant,
                      f"{UNIFIED_RADIX_CACHE}.UnifiedRadixCache")
    original = find_method(cache_cls, "checkpoint_into_tree", mutant, ("req", "up_to"))
    find_method(cache_cls, "unlock", mutant)

    def checkpoint_into_tree(self, req, *, up_to, **kwargs):
        old = req.lock
        req.lock = None  # MUTANT: the insert's `self.unlock(req.lock)` now releases nothing
        try:
            return original(self, req, up_to=up_to, **kwargs)
        finally:
            if req.lock is None:  # an early return moved no lock: the request keeps its own
                req.lock = old

    replace_attr(cache_cls, "checkpoint_into_tree", checkpoint_into_tree, original)


# --- radix lock refs: a release without checkpoint keeps the lock -----------------


@mutant("mut_release_without_checkpoint_keeps_lock", topologies=ALL,
        summary="a release without checkpoint (retract, chunked abort) never unlocks the request's tree node",
        expected="invariant radix_locks (locked nodes at idle), end-state check (tokens still protected)")
def _install_mut_release_without_checkpoint_keeps_lock(scheduler_module: Any) -> None:
    """``release_kv_cache(req, tree_cache, checkpoint=False)`` frees the row
    and the uncached KV but no longer unlocks the request's tree node: the
    unlock moved into the checkpoint branch. Hit by every release that does
    not insert into the tree: a retract (pause_generation retract, decode
    out of memory), a chunked request's abort, a discarded output.

    Plausible: ``checkpoint`` re-anchors the lock on the inserted node, so a
    refactor that "keeps lock handling next to the insert" unlocks only after
    a checkpoint. Done by patching the function where the scheduler modules
    imported it (``mem_cache.common.release_kv_cache`` and every module
    holding that name).

    Seen by: invariant radix_locks at the first idle iteration after such a
    release of a request locked on a non-root node (a cached-prefix hit, or a
    chunked prompt past its first chunk), and the end-state check (tree
    tokens still protected). All topologies."""
    mutant = "mut_release_without_checkpoint_keeps_lock"
    scheduler_class(scheduler_module, mutant)
    common = find_module(MEM_CACHE_COMMON, mutant)
    original = find_attr(common, "release_kv_cache", mutant, f"{MEM_CACHE_COMMON}.release_kv_cache")
    if "checkpoint" not in inspect.signature(original).parameters:
        raise missing_target(mutant, f"{MEM_CACHE_COMMON}.release_kv_cache(req, tree_cache, *, checkpoint)")

    def release_kv_cache(req, tree_cache, *, checkpoint):
        if req.kv.holds_kv and not (checkpoint and not req.skip_radix_cache_insert):
            req.lock = None  # MUTANT: only the checkpoint branch unlocks; this lock is never released
        return original(req, tree_cache, checkpoint=checkpoint)

    release_kv_cache.__wrapped__ = original
    holders = [mod for name, mod in list(sys.modules.items())
               if name.startswith("sglang.") and getattr(mod, "release_kv_cache", None) is original]
    if scheduler_module not in holders or common not in holders:
        raise missing_target(mutant, "release_kv_cache imported by sglang.srt.managers.scheduler")
    for mod in holders:
        setattr(mod, "release_kv_cache", release_kv_cache)


# --- written blind, second set: admission does not lock the matched prefix -----------


@mutant("mut_admission_skips_prefix_lock", topologies=ALL,
        summary="an admitted request does not lock its matched prefix: under KV pressure the prefix it reads can be "
                "evicted and its slots reused before its first checkpoint",
        expected="unknown (written blind); should show as wrong outputs for a prefix hit under KV pressure (its "
                 "prefix KV evicted and reused), then a KV accounting crash or a double free")
def _install_mut_admission_skips_prefix_lock(scheduler_module: Any) -> None:
    """``PrefillAdder._commit_prefill_admission`` no longer takes the
    tree lock on the request's matched prefix (``req.lock =
    self.tree_cache.lock(req.last_node)``). ``add_one_req`` pins that node
    only for the duration of the budget check (``_lock_node``), so after
    admission the prefix the request is about to read is evictable until the
    request's first checkpoint (after its prefill result is processed) locks
    the path it inserted. Meanwhile the next candidates of the same pass
    count it as reclaimable, and the batch's own allocation
    (``alloc_for_extend`` -> ``evict_from_tree_cache``) -- under the overlap
    loop also the next step's decode allocation, which runs before the
    prefill result is processed -- may evict it: its KV slots go back to the
    allocator while the request's row still points at them, and the next
    allocations reuse them. Every unlock of ``req.lock`` accepts None, so
    nothing complains.

    Plausible: the lock looks duplicated by the ``_lock_node`` context right
    above it ("the temporary pin excludes this prefix"), and a refactor that
    moves locking into that context loses the long-lived one. Without KV
    pressure nothing is evicted and every answer is right. The body is
    copied from 0.5.23 (checked by source digest) with the lock line
    removed.

    Trigger: a prefix-cache hit (the same prompt again, or a shared prefix)
    for a request admitted while KV is short (little free KV, most of the
    rest evictable tree entries), typically with other requests admitted in
    the same prefill pass or decoding next to it. The warm-up has no prefix
    hit.

    Seen by (written blind), as a user sees it: wrong tokens for the request
    with the prefix hit (its prompt prefix KV is overwritten by other
    tokens' KV), and later, when the request's checkpoint inserts those
    reused slots into the tree again, two owners for the same KV slots:
    possibly wrong tokens for later prefix hits too, and SGLang's own idle
    pool check failing (KV accounting off) or a double free. All
    topologies."""
    mutant = "mut_admission_skips_prefix_lock"
    scheduler_class(scheduler_module, mutant)
    adder_cls = find_attr(find_module(SCHEDULE_POLICY, mutant), "PrefillAdder", mutant,
                          f"{SCHEDULE_POLICY}.PrefillAdder")
    find_method(adder_cls, "_lock_node", mutant)
    original = find_method(adder_cls, "_commit_prefill_admission", mutant, ("req", "admission", "mamba_gap_reserve"))
    check_copied_body(original, COMMIT_PREFILL_ADMISSION_DIGEST, mutant, "PrefillAdder._commit_prefill_admission")

    def _commit_prefill_admission(self, req, admission, mamba_gap_reserve: int) -> None:
        assert req.prefix_len == admission.prefix_len
        req.extend_end = admission.prefix_len + admission.extend_len
        # MUTANT: `req.lock = self.tree_cache.lock(req.last_node)` removed; the prefix stays evictable
        self.can_run_list.append(req)
        if admission.is_chunked:
            self.new_chunked_req = req
        self._update_prefill_budget(
            admission.prefix_len,
            admission.extend_len,
            admission.max_new_tokens,
            req.retracted_stain,
            mamba_gap_reserve=mamba_gap_reserve,
            request_slot_reserve=self._request_slot_reserve_for_req(
                req, extend_input_len=admission.extend_len
            ),
            replay_len=admission.replay_len,
        )
        self._account_prefill_cache_admission(req, admission.prefix_len)

    replace_attr(adder_cls, "_commit_prefill_admission", _commit_prefill_admission, original)
