"""HiCache (SGLang's hierarchical cache) state, read-only, in the scheduler
process: the one place that knows where 0.5.23 keeps it (docs/sglang-facts.md,
"HiCache on CPU"). ``scheduler.tree_cache`` holds ``cache_controller`` (its
host pool ``mem_pool_host``, the ``write_queue``/``load_queue`` of copies
not yet issued and the ``ack_*_queue`` of copies issued and not yet
acknowledged), ``ongoing_write_through`` (device->host backups not yet
reaped) and ``ongoing_load_back`` (host->device loads not yet reaped); a
batch's ``hicache_consumer_index`` (>= 0) says it waits on a load.
Without a storage backend the copies run on the scheduler thread, so a
backup or load stays "ongoing" from the iteration that issued it to the
start of the next ``get_next_batch_to_run``, which reaps it.
"""
from __future__ import annotations

from typing import Any, Dict, Optional

from scripted_runtime.hooks import hicache_gate
from scripted_runtime.scheduler_side import state


def controller(scheduler: Any) -> Optional[Any]:
    """The cache controller, or None when HiCache is off."""
    return getattr(getattr(scheduler, "tree_cache", None), "cache_controller", None)


def _len(obj: Any, name: str) -> int:
    return len(getattr(obj, name, None) or ())


def view(scheduler: Any) -> Optional[Dict[str, Any]]:
    """What a script may read of HiCache now; None when HiCache is off."""
    ctl = controller(scheduler)
    if ctl is None:
        return None
    tree = scheduler.tree_cache
    host = getattr(ctl, "mem_pool_host", None)
    last = getattr(scheduler, "last_batch", None)
    return {
        "host_free": int(host.available_size()) if host is not None else 0,
        "host_size": int(getattr(host, "size", 0) or 0),
        "write_queue": _len(ctl, "write_queue"),
        "load_queue": _len(ctl, "load_queue"),
        "ack_write_queue": _len(ctl, "ack_write_queue"),
        "ack_load_queue": _len(ctl, "ack_load_queue"),
        "ongoing_write_through": _len(tree, "ongoing_write_through"),
        "ongoing_load_back": _len(tree, "ongoing_load_back"),
        "last_batch_consumer_index": getattr(last, "hicache_consumer_index", None) if last is not None else None,
        # every held batch that waits on a load (under PP the one that used it may sit in an mbs slot)
        "consumer_indices": consumer_indices(scheduler),
        # the transfer gate (hooks/hicache_gate.py): what it holds now
        "holding": {k for k, on in hicache_gate.gate().holding.items() if on},
        **hicache_gate.gate().counts(),
    }


def consumer_indices(scheduler: Any) -> Dict[str, int]:
    """holder label -> ``hicache_consumer_index`` of each held batch that
    waits on a load (index >= 0)."""
    out = {}
    for h in state.holders(scheduler):
        index = getattr(h.batch, "hicache_consumer_index", -1) if h.batch is not None else -1
        if index is not None and index >= 0:
            out[h.label] = int(index)
    return out


def write_through_pending(scheduler: Any) -> int:
    """Device->host backups issued and not yet reaped (0 when HiCache is off)."""
    return _len(getattr(scheduler, "tree_cache", None), "ongoing_write_through")


def load_back_pending(scheduler: Any) -> int:
    """Host->device loads issued and not yet reaped (0 when HiCache is off)."""
    return _len(getattr(scheduler, "tree_cache", None), "ongoing_load_back")


def host_pool(scheduler: Any) -> Optional[Any]:
    """The host KV pool, or None: ``cache_controller.mem_pool_host``, or
    where that is a ``HostPoolGroup`` (0.5.23's hybrid controller), its
    anchor entry's pool (the full-attention KV one)."""
    host = getattr(controller(scheduler), "mem_pool_host", None)
    entry = getattr(host, "anchor_entry", None)
    return entry.host_pool if entry is not None else host


def tree_host_slots(scheduler: Any) -> Any:
    """Every host slot the radix tree's nodes hold (their full-attention
    ``host_value``), as one int64 numpy array (duplicates kept)."""
    import numpy as np

    core = getattr(scheduler.tree_cache, "tree_core", None)
    parts = []
    if core is not None:
        full = _full_index()
        stack = [core.root_node]
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            data = getattr(node, "component_data", None)
            if not data:
                continue
            host_value = data[full].host_value
            if host_value is not None:
                parts.append(host_value)
    if not parts:
        return np.empty(0, dtype=np.int64)
    try:  # host indices live on the CPU: a zero-copy view each
        arrays = [p.numpy() for p in parts]
    except TypeError:  # not on the CPU after all
        arrays = [p.cpu().numpy() for p in parts]
    return np.concatenate(arrays).reshape(-1).astype(np.int64, copy=False)


_FULL = None


def _full_index() -> Any:
    """The index of the full-attention entry in a node's ``component_data``
    (a list indexed by ``BASE_COMPONENT_TYPE``, ``ComponentType.FULL``, in
    0.5.23); looked up once."""
    global _FULL
    if _FULL is None:
        from sglang.srt.mem_cache.unified_cache.component_type import BASE_COMPONENT_TYPE

        _FULL = BASE_COMPONENT_TYPE
    return _FULL


def ack_events(scheduler: Any) -> set:
    """ids of the finish events of every ack SGLang has not reaped yet."""
    ctl = controller(scheduler)
    if ctl is None:
        return set()
    return {id(ack.finish_event) for queue in (getattr(ctl, "ack_write_queue", ()), getattr(ctl, "ack_load_queue", ()))
            for ack in queue}


def storage_enabled(scheduler: Any) -> bool:
    """Whether an L3 storage backend is attached (prefetch buffers then hold
    host slots outside the tree)."""
    return bool(getattr(scheduler.tree_cache, "enable_storage", False))
