"""HiCache mutants (pp1-hicache: HiCache on, a 400-token device pool): a
load-back read before it lands, a write-through backup whose slots are not
locked, a host slot leaked by host eviction."""
from __future__ import annotations

from typing import Any

from scripted_runtime.hooks.mutants.base import (FULL_COMPONENT, HICACHE, TP_WORKER, UNIFIED_RADIX_CACHE,
                                                 mutant, find_attr, find_method, find_module, replace_attr, scheduler_class)


@mutant("mut_hicache_forward_skips_load_wait", topologies=HICACHE,
        summary="the forward never waits on the HiCache load-back it reads (PR 19177: a CUDA-graph replay)",
        expected="invariant hicache_load_before_read")
def _install_mut_hicache_forward_skips_load_wait(scheduler_module: Any) -> None:
    """``TpModelWorker.set_hicache_consumer`` drops the batch's producer
    index (the consumer stays -1), so the forward's attention never waits on
    the layer events of the load-back it reads.

    Plausible: PR 19177's race. A CUDA-graph replay does not run the wait in
    ``get_key_buffer``; the scheduler's own TODO says "disable cuda graph
    execution if hicache loading triggered".

    Seen by: invariant hicache_load_before_read, once the transfer gate
    holds a load that a batch reads (explorer: hold loads, then a prefix
    evicted to the host asked for again). Without a held load the CPU copy
    completes where it is issued and nothing is read early."""
    mutant = "mut_hicache_forward_skips_load_wait"
    scheduler_class(scheduler_module, mutant)
    worker_cls = find_attr(find_module(TP_WORKER, mutant), "TpModelWorker", mutant, f"{TP_WORKER}.TpModelWorker")
    original = find_method(worker_cls, "set_hicache_consumer", mutant, ("consumer_index",))

    def set_hicache_consumer(self, consumer_index: int):
        return original(self, -1)  # MUTANT: the batch's load is never waited on

    replace_attr(worker_cls, "set_hicache_consumer", set_hicache_consumer, original)


@mutant("mut_hicache_write_through_skips_lock", topologies=HICACHE,
        summary="a node whose write-through backup is pending is not locked (eviction can free what it reads)",
        expected="invariant hicache_transfer_slots")
def _install_mut_hicache_write_through_skips_lock(scheduler_module: Any) -> None:
    """A node whose write-through backup is pending is not kept locked: the
    lock taken for the backup is dropped right away, so eviction may free
    the device slots the backup still reads.

    Plausible: the write-back policy takes no lock (``write_back=True``);
    sharing that path with write-through loses the lock.

    Seen by: invariant hicache_transfer_slots, once the gate holds a backup
    and the device pool needs the room (explorer: hold backups, finish a
    request, start others)."""
    mutant = "mut_hicache_write_through_skips_lock"
    scheduler_class(scheduler_module, mutant)
    cache_cls = find_attr(find_module(UNIFIED_RADIX_CACHE, mutant), "UnifiedRadixCache", mutant,
                      f"{UNIFIED_RADIX_CACHE}.UnifiedRadixCache")
    original = find_method(cache_cls, "_track_write_through_node", mutant,
                       ("node_id", "lock_params", "publish_node_ids"))

    def _track_write_through_node(self, node_id, lock_params, publish_node_ids):
        if lock_params is not None:
            self.dec_lock_ref(node_id, lock_params)  # MUTANT: the backup's lock is dropped at once
        return original(self, node_id, None, publish_node_ids)

    replace_attr(cache_cls, "_track_write_through_node", _track_write_through_node, original)


@mutant("mut_hicache_host_evict_leaks", topologies=HICACHE,
        summary="host eviction frees each evicted node's host slots but the last (one leaks per node)",
        expected="invariant hicache_host_accounting")
def _install_mut_hicache_host_evict_leaks(scheduler_module: Any) -> None:
    """Host eviction frees each evicted node's host slots but the last one:
    that slot stays allocated in the host pool with no node holding it.

    Plausible: an off-by-one in a page-aligned slice of the evicted value
    (the device allocator's ``mut_kv_free_drops_last_index``, on the host).

    Seen by: invariant hicache_host_accounting (host slots allocated that no
    tree node holds), once the host pool fills and evicts (pp1-hicache's
    481-slot host pool: three long prompts)."""
    mutant = "mut_hicache_host_evict_leaks"
    scheduler_class(scheduler_module, mutant)
    component_cls = find_attr(find_module(FULL_COMPONENT, mutant), "FullComponent", mutant,
                          f"{FULL_COMPONENT}.FullComponent")
    original = find_method(component_cls, "free_host_values", mutant, ("host_values",))

    def free_host_values(self, host_values):
        return original(self, [v[:-1] for v in host_values])  # MUTANT: each value's last slot leaks

    replace_attr(component_cls, "free_host_values", free_host_values, original)
