"""Named race windows: predicates over scheduler state that a script can wait
for (``yield from ctx.wait_for_window(name)``) and inject into.

Each window is evaluated at the start of every iteration, after the previous
one finished and before the scheduler ingests what the script sends next;
that is the moment a control operation injected by the script is processed.
A predicate returns ``None`` when the window is closed, else a short detail
(which request, which slot) for the trace.

Per run the ``WindowTracker`` counts, for every window:

* ``reached``: how many times it opened (closed -> open transitions seen);
* ``open_steps``: iterations it was open;
* ``entered``: how many times a script's ``wait_for_window`` returned inside
  it, i.e. the script got control in the window and could inject.

Each window is registered with ``check_registry.window`` next to its
predicate, as an extension's ``@ext.window`` is. Windows read state through
``scripted_runtime.scheduler_side.state`` (the one place that knows where
SGLang keeps requests); what each means is in docs/checks.md, and the facts
behind them in ``docs/sglang-facts.md``, "SGLang internals that matter".
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from scripted_runtime.hooks import sglang_compat
from scripted_runtime.scheduler_side import check_registry, hicache_state, state
from scripted_runtime.scheduler_side.check_registry import Predicate, Window


def _rids(reqs) -> str:
    return ",".join(r.rid for r in reqs)


def _batch_live(batch: Any) -> bool:
    return batch is not None and any(not r.finished() for r in (getattr(batch, "reqs", None) or ()))


def _is_extend(batch: Any) -> bool:
    mode = getattr(batch, "forward_mode", None)
    return mode is not None and mode.is_extend()


@check_registry.window(
    "pp_inflight_after_last_chunk", loops=("pp",), source="PR 27446",
    doc=(
        "Under PP: the last chunk of a request was dispatched (chunked_req is None) and its "
        "extend batch still sits in an mbs slot, every running_mbs is empty and the queues "
        "are empty. Before 0.5.13 is_fully_idle() said idle here and a flush reset the tree "
        "under the in-flight chunk."),
)
def pp_inflight_after_last_chunk(s: Any) -> Optional[str]:
    if getattr(s, "chunked_req", None) is not None or list(getattr(s, "waiting_queue", ()) or ()):
        return None
    if any(_batch_live(b) for b in getattr(s, "running_mbs", ()) or ()):
        return None
    for i, batch in enumerate(getattr(s, "mbs", ()) or ()):
        if batch is not None and _is_extend(batch) and _batch_live(batch):
            return f"mbs[{i}]=[{_rids(batch.reqs)}]"
    return None


@check_registry.window(
    "finished_not_pruned", loops=("normal", "overlap", "pp"), source="issue 14062",
    doc=(
        "A finished request still sits in running_batch (or last_batch / result_queue / "
        "running_mbs) at the start of an iteration: ingest runs before "
        "get_next_batch_to_run prunes it. update_weights(flush_cache=True) here asserted "
        "(<=0.5.21) or is refused (0.5.22+)."),
)
def finished_not_pruned(s: Any) -> Optional[str]:
    # PP slots in flight (mbs, last_mbs) are pp_inflight's business. Runs
    # every iteration, so it walks the places without building holders.
    for name, i, batch, reqs in state.places(s, pp_slots=("running_mbs",)):
        if batch is None:
            continue
        done = [r for r in reqs if r.finished()]
        if done:
            return f"{state.place_label(name, i)}=[{_rids(done)}]"
    return None


@check_registry.window(
    "chunked_between_chunks", loops=("normal", "overlap", "pp"), source="PR 17850",
    doc=(
        "A chunked-prefill request is parked between two of its chunks (chunked_req set) "
        "and holds its req_to_token row. Before 0.5.9 it released the row after every chunk."),
)
def chunked_between_chunks(s: Any) -> Optional[str]:
    req = getattr(s, "chunked_req", None)
    if req is None or req.finished():
        return None
    row = state.req_pool_idx(req)
    if row is None:
        return None
    return f"{req.rid}@row{row}"


@check_registry.window(
    "overlap_result_pending", loops=("overlap",), source="issue 18744",
    doc=(
        "Overlap loop: a launched batch whose result is not processed yet (result_queue) "
        "holds a request that has already finished; its row is free while that forward "
        "still reads it."),
)
def overlap_result_pending(s: Any) -> Optional[str]:
    if sglang_compat.loop_kind(s) != "overlap":
        return None
    for i, entry in enumerate(getattr(s, "result_queue", None) or ()):
        batch = entry[0] if isinstance(entry, tuple) else entry
        done = [r for r in (getattr(batch, "reqs", None) or ()) if r.finished()]
        if done:
            return f"result_queue[{i}]=[{_rids(done)}]"
    return None


@check_registry.window(
    "paused_in_place_busy", loops=("normal", "overlap", "pp"), source="PR 10071",
    doc=(
        "Engine paused with mode=in_place while a batch still holds a live request: "
        "flush_cache is refused for the whole pause."),
)
def paused_in_place_busy(s: Any) -> Optional[str]:
    if not sglang_compat.is_paused(s):
        return None
    for holder in state.holders(s):
        if holder.label == "waiting_queue":
            continue
        live = [r for r in holder.reqs if not r.finished()]
        if live:
            return f"{holder.label}=[{_rids(live)}]"
    return None


@check_registry.window(
    "paused_retract_waiting_with_kv", loops=("normal", "overlap", "pp"), source="PR 10071",
    doc=(
        "Engine paused with mode=retract: live requests were moved back to the waiting "
        "queue and their KV sits in the radix tree (or a row). A flush here drops that "
        "cache; it was refused until 0.5.21 (ignore_waiting)."),
)
def paused_retract_waiting_with_kv(s: Any) -> Optional[str]:
    if not sglang_compat.is_paused(s):
        return None
    retracted = [r for r in getattr(s, "waiting_queue", ()) or () if getattr(r, "is_retracted", False)]
    if not retracted:
        return None
    with_row = [r for r in retracted if state.holds_kv(r)]
    if with_row:
        return f"waiting rows: {_rids(with_row)}"
    cached = state.engine_stats(s)["tree_tokens"]
    if cached > 0:
        return f"waiting=[{_rids(retracted)}] tree_tokens={cached}"
    return None


@check_registry.window(
    "prefill_not_merged", loops=("normal", "overlap"), source="PR 10071",
    doc=(
        "The prefill batch just run sits in last_batch with a live request that is not being chunked, "
        "not merged into running_batch yet (that happens at the next get_next_batch_to_run). Whatever "
        "lands here must treat it as running: pause_generation(retract) retracts last_batch's requests "
        "explicitly, is_fully_idle checks last_batch."),
)
def prefill_not_merged(s: Any) -> Optional[str]:
    last = getattr(s, "last_batch", None)
    if last is None or not _is_extend(last):
        return None
    chunked = getattr(s, "chunked_req", None)
    live = [r for r in getattr(last, "reqs", None) or () if not r.finished() and r is not chunked]
    return f"last_batch=[{_rids(live)}]" if live else None


@check_registry.window(
    "decode_retracted_waiting", loops=("normal", "overlap", "pp"), source="retract_decode",
    doc=(
        "Not paused, yet a request waits in the queue after a retraction: decoding ran short of KV "
        "(ScheduleBatch.retract_decode) and the request must be re-admitted with its prompt and the "
        "tokens it already generated (Req.refresh_fill_ids)."),
)
def decode_retracted_waiting(s: Any) -> Optional[str]:
    if sglang_compat.is_paused(s):
        return None
    retracted = [r for r in getattr(s, "waiting_queue", ()) or ()
                 if getattr(r, "is_retracted", False) and not r.finished()]
    return f"waiting=[{_rids(retracted)}]" if retracted else None


@check_registry.window(
    "hicache_write_through_pending", loops=("normal", "overlap", "pp"), source="HiCache",
    doc=(
        "HiCache: a device->host backup was issued and is not reaped yet (ongoing_write_through); "
        "is_fully_idle is false, so a flush here is refused. Closed when HiCache is off."),
    needs="hicache",
)
def hicache_write_through_pending(s: Any) -> Optional[str]:
    n = hicache_state.write_through_pending(s)
    return f"backups={n}" if n else None


@check_registry.window(
    "hicache_load_in_progress", loops=("normal", "overlap", "pp"), source="PR 19177",
    doc=(
        "HiCache: a host->device load was issued and is not reaped yet (ongoing_load_back); a batch "
        "scheduled now may read rows the load writes (PR 19177's race, with the copy still in flight "
        "on a GPU). Closed when HiCache is off."),
    needs="hicache",
)
def hicache_load_in_progress(s: Any) -> Optional[str]:
    n = hicache_state.load_back_pending(s)
    return f"loads={n}" if n else None


# The table the tracker, ctx.wait_for_window and the explorer read: the built-in
# windows, then the extension windows extensions.register_windows adds.
WINDOWS: Dict[str, Window] = check_registry.builtin_windows()


BUILTIN = frozenset(WINDOWS)  # extension windows (scripted_runtime/extensions.py) are added to WINDOWS


def get(name: str) -> Window:
    try:
        return WINDOWS[name]
    except KeyError:
        raise KeyError(f"unknown window {name!r}; known: {', '.join(WINDOWS)}") from None


@dataclass
class WindowStats:
    reached: int = 0
    open_steps: int = 0
    entered: int = 0

    def as_dict(self) -> Dict[str, int]:
        return {"reached": self.reached, "open_steps": self.open_steps, "entered": self.entered}


class WindowTracker:
    """Evaluates every window once per iteration and counts hits for one run."""

    def __init__(self, windows: Optional[Dict[str, Window]] = None) -> None:
        self.windows = windows if windows is not None else WINDOWS
        self.stats: Dict[str, WindowStats] = {name: WindowStats() for name in self.windows}
        self.open: Dict[str, str] = {}  # name -> detail, as of the last observe()
        self.opened_now: List[str] = []
        self._by_loop: Dict[str, List[Tuple[str, Predicate]]] = {}

    def clear(self) -> None:
        for st in self.stats.values():
            st.reached = st.open_steps = st.entered = 0
        self.open = {}
        self.opened_now = []

    def observe(self, scheduler: Any, loop: str) -> Dict[str, str]:
        checks = self._by_loop.get(loop)
        if checks is None:
            checks = self._by_loop[loop] = [(n, w.predicate) for n, w in self.windows.items() if loop in w.loops]
        now: Dict[str, str] = {}
        for name, predicate in checks:
            detail = predicate(scheduler)
            if detail is not None:
                now[name] = detail
        if not now and not self.open:
            self.opened_now = []  # the common case, every quiet iteration
            return now
        self.opened_now = [n for n in now if n not in self.open]
        for name in now:
            self.stats[name].open_steps += 1
        for name in self.opened_now:
            self.stats[name].reached += 1
        self.open = now
        return now

    def mark_entered(self, name: str) -> None:
        self.stats[name].entered += 1

    def report(self) -> Dict[str, Dict[str, int]]:
        return {name: st.as_dict() for name, st in self.stats.items()}
