"""What a reset must give back (scheduler process): a fingerprint of the
scheduler state that decides what a later script sees.

The driver takes it after the first reset of a server's life (the engine as
it came up) and again after every reset; a difference is a ``ResetError``
that names each part the reset left behind, so a script never runs on an
engine that an earlier one changed (a failure would then not replay on a
fresh server).

The parts, read off 0.5.23's scheduler (``event_loop_*``,
``get_next_batch_to_run``, ``get_new_batch_prefill``, ``update_running_batch``,
``self_check_during_idle``, ``flush_cache``, ``pause_generation``):

* the pools: the req_to_token free rows *in order* (a new request takes the
  first), the KV allocator's free count and the head of its free list (the
  indices handed out next), the radix tree's size and its locked tokens;
* every place a request can be held: waiting queue, running batch,
  ``last_batch``, ``chunked_req``, the overlap ``result_queue``, every PP
  microbatch slot (``mbs``, ``last_mbs``, ``running_mbs``);
* the pause: ``_engine_paused`` and ``_pause_started_at``;
* a deferred flush (``flush_wrapper._pending``) and requests the scheduler
  deferred while paused (``_deferred_input_requests``);
* the admission estimate ``new_token_ratio_tracker.current`` (retraction
  raises it, decode steps lower it; the idle check resets it), which decides
  how many waiting requests a prefill admits;
* the schedule policy's call counters (every 32nd prefill pass with a request waiting re-matches
  the waiting requests' prefixes, which can split a radix node; the reset's
  flush starts them from 0 on every rank: ``sglang_compat.POLICY_CALL_COUNTERS``);
* the runtime knobs and open sessions (``runtime_knobs``: the micro-batch
  limit, slow_down's sleep, the weight version label, a weight-update
  session, the open sessions, whose requests outlive a flush; the reset
  turns them back);
* released memory (``offload_tags``; the reset resumes it), weights a
  release lost that no update loaded again (``memory_occupation``: a script
  that resumed weights without an update leaves the server serving garbage,
  which only a weight update or a fresh server repairs), and the sums of
  the model's buffers (a resume that did not put them back leaves a model
  no checkpoint gives: every later output would differ).

Counters that only grow and decide nothing here (``forward_ct``, metrics) are
left out. A part a release does not have reads as None on both sides.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional

from scripted_runtime.hooks import sglang_compat
from scripted_runtime.scheduler_side import memory_occupation, runtime_knobs, state

FREE_LIST_HEAD = 16  # KV indices compared at the head of the allocator's free list


def _len(x: Any) -> Optional[int]:
    if x is None:
        return 0
    try:
        return len(x)
    except TypeError:
        return None


def _free_head(allocator: Any) -> Optional[tuple]:
    pages = getattr(allocator, "free_pages", None)
    if pages is None:
        return None
    try:
        return tuple(int(v) for v in pages[:FREE_LIST_HEAD].tolist())
    except Exception:  # noqa: BLE001 - another allocator layout: not compared
        return None


def _slots_held(s: Any, name: str) -> Optional[int]:
    slots = getattr(s, name, None)
    if slots is None:
        return None
    return sum(1 for b in slots if b is not None and not getattr(b, "is_empty", lambda: False)())


def take(s: Any) -> Dict[str, Any]:
    """The fingerprint of scheduler ``s`` now (cheap: run once per reset)."""
    pool = s.req_to_token_pool
    allocator = s.token_to_kv_pool_allocator
    stats = state.engine_stats(s)
    tracker = getattr(s, "new_token_ratio_tracker", None)
    flush_wrapper = getattr(s, "flush_wrapper", None)
    running = getattr(s, "running_batch", None)
    return {
        "req_to_token free rows (in order)": tuple(getattr(pool, "free_slots", ()) or ()),
        "KV free tokens": stats["kv_pool_free"],
        "KV free-list head": _free_head(allocator),
        "tree tokens": stats["tree_tokens"],
        "tree evictable tokens": stats["evictable"],
        "tree locked tokens": stats["protected"],
        "waiting_queue": _len(getattr(s, "waiting_queue", None)),
        "running_batch requests": _len(getattr(running, "reqs", None)) if running is not None else 0,
        # (the PP loop keeps an empty last_batch once it ran one: only its requests count)
        "last_batch requests": _len(getattr(getattr(s, "last_batch", None), "reqs", None)),
        "chunked_req": getattr(s, "chunked_req", None) is not None,
        "result_queue": _len(getattr(s, "result_queue", None)),
        "PP mbs slots holding a batch": _slots_held(s, "mbs"),
        "PP last_mbs slots holding a batch": _slots_held(s, "last_mbs"),
        "PP running_mbs slots holding requests": (
            None if getattr(s, "running_mbs", None) is None
            else sum(1 for b in s.running_mbs if b is not None and _len(getattr(b, "reqs", None)))),
        "paused (_engine_paused)": bool(getattr(s, "_engine_paused", False)),
        "pause clock (_pause_started_at set)": getattr(s, "_pause_started_at", None) is not None,
        "deferred flush": getattr(flush_wrapper, "_pending", None) is not None,
        "requests deferred while paused": _len(getattr(s, "_deferred_input_requests", None)),
        "new_token_ratio": round(float(tracker.current), 9) if tracker is not None else None,
        "schedule policy call counters": sglang_compat.policy_call_counters(s),
        "released memory (offload_tags)": sglang_compat.released_memory_tags(s),
        # a release overwrote the weights (memory_occupation) and no update loaded them
        "weights lost to a release and not loaded again": memory_occupation.weights_lost(s),
        "model buffers (sums)": _buffer_sums(s),
        **runtime_knobs.take(s),
    }


def _buffer_sums(s: Any) -> Optional[tuple]:
    """Per model buffer (the static state a weight update does not load:
    rotary caches), its name and sum: a resume that did not put them back
    leaves every later script a model no checkpoint gives."""
    model = sglang_compat.served_model(s)
    if model is None:
        return None
    try:
        return tuple((name, round(float(b.detach().double().sum()), 6)) for name, b in model.named_buffers())
    except Exception:  # noqa: BLE001 - another layout: not compared
        return None


def diff(fresh: Dict[str, Any], now: Dict[str, Any]) -> List[str]:
    """One phrase per part that differs from the fresh engine's."""
    out = []
    for key, want in fresh.items():
        got = now.get(key)
        if got == want:
            continue
        if isinstance(want, tuple) and isinstance(got, tuple) and len(want) > 8:
            if sorted(want) == sorted(got):
                out.append(f"{key}: the same {len(got)} but in another order (first {list(got[:6])}, "
                           f"fresh {list(want[:6])})")
            else:
                gone = sorted(set(want) - set(got))
                extra = sorted(set(got) - set(want))
                out.append(f"{key}: {len(got)} now, {len(want)} on the fresh engine"
                           + (f"; missing {gone[:8]}" if gone else "") + (f"; extra {extra[:8]}" if extra else ""))
        else:
            out.append(f"{key}: {got!r} now, {want!r} on the fresh engine")
    return out
