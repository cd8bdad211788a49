"""Mutants of the radix tree's lock refs: a request's lock moved by a
checkpoint, and released by a release without checkpoint."""
from __future__ import annotations

import inspect
import sys
from typing import Any

from scripted_runtime.hooks.mutants.base import (ALL, MEM_CACHE_COMMON, UNIFIED_RADIX_CACHE, mutant, find_attr,
                                                 find_method, missing_target, find_module, replace_attr, scheduler_class)


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
