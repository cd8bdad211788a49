"""Request handles returned by ``ctx.start_req`` and the tracker behind them."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, NamedTuple, Optional, Tuple

from scripted_runtime.scheduler_side import state
from scripted_runtime.scheduler_side.contracts import matches_abort
from scripted_runtime.scheduler_side.context import radix
from scripted_runtime.scheduler_side.http_poster import HttpAnswer

if TYPE_CHECKING:
    from scripted_runtime.scheduler_side.context.api import ScriptContext


class BatchRecord(NamedTuple):
    """One forward launched by ``run_batch`` (a named tuple: one is built per
    forward, on the scheduler's hot path)."""

    step: int  # ctx.step as it launched: the script's step-1 ran just before it (step 0's request launches at 1)
    slot: Optional[int]  # PP microbatch slot, None outside PP
    mode: Optional[str]  # "extend", "decode", "idle", ...
    rids: Tuple[str, ...]
    chunked_rid: Optional[str]
    rows: Tuple[Optional[int], ...] = ()  # req_to_token row per request, as launched
    # (rid, row) of launched batches whose results were not processed yet at
    # this launch (overlap): rows their forwards may still read.
    in_flight: Tuple[Tuple[str, int], ...] = ()

    def rows_taken_in_flight(self) -> List[Tuple[str, str, int]]:
        """(new rid, in-flight rid, row): a row this batch uses that a
        different request's still-unprocessed forward was launched with."""
        taken = []
        for rid, row in zip(self.rids, self.rows):
            for old_rid, old_row in self.in_flight:
                if row is not None and row == old_row and rid != old_rid:
                    taken.append((rid, old_rid, row))
        return taken


class RequestTracker:
    """Keeps the Req object of every request a script started, so a handle
    can still report how it ended after the scheduler has let go of it."""

    def __init__(self) -> None:
        self.reqs: Dict[str, Any] = {}
        self.ingested: set = set()
        self.handles: List["ReqHandle"] = []  # what the running script started, in order (the trace's "started")
        # rids an abort_request matched as it was processed: SGLang drops an
        # aborted waiting request without a finish reason
        self.abort_matched: set = set()

    def clear(self) -> None:
        self.reqs.clear()
        self.ingested.clear()
        self.handles.clear()
        self.abort_matched.clear()

    def on_abort(self, abort_req: Any, scheduler: Any) -> None:
        """An ``AbortReq`` is about to be processed: remember which waiting
        requests it matches (SGLang matches by rid prefix, or all; it drops
        a matched waiting request without a finish reason, while a running
        one is finished with FINISH_ABORT)."""
        for req in getattr(scheduler, "waiting_queue", ()) or ():
            if matches_abort(abort_req, req.rid):
                self.abort_matched.add(req.rid)

    def on_ingested(self, rid: str, scheduler: Any) -> None:
        self.ingested.add(rid)
        for req in reversed(list(getattr(scheduler, "waiting_queue", ()) or ())):
            if req.rid == rid:
                self.reqs[rid] = req
                return

    def on_batch(self, reqs: Any) -> None:
        """A forward launched with these requests."""
        for req in reqs or ():
            self.reqs.setdefault(req.rid, req)


def _is_abort(reason: Any) -> bool:
    return reason is not None and type(reason).__name__ == "FINISH_ABORT"


class ReqHandle:
    """A request started by a script. Every property reads live state."""

    def __init__(self, ctx: ScriptContext, rid: str, http: HttpAnswer, posted_step: int):
        self._ctx = ctx
        self.rid = rid
        self.http = http  # the /generate answer, once the request completes
        self.posted_step = posted_step

    # --- where it is ---------------------------------------------------------
    @property
    def req(self) -> Optional[Any]:
        """The live Req object while the scheduler holds it, else None."""
        return state.find_req(self._ctx.scheduler, self.rid)

    @property
    def last_req(self) -> Optional[Any]:
        """The Req object as last held (kept after the scheduler released it)."""
        return self.req or self._ctx._driver.tracker.reqs.get(self.rid)

    @property
    def holders(self) -> List[str]:
        return state.where_is(self._ctx.scheduler, self.rid)

    @property
    def status(self) -> str:
        """posted | waiting | chunking | running | finished | aborted | lost

        ``lost``: the scheduler took the request in, holds it nowhere now,
        and never finished it (no finish reason): dropped without an answer."""
        s = self._ctx.scheduler
        req = self.req
        if req is not None:
            if req.finished():
                return "aborted" if _is_abort(req.finished_reason) else "finished"
            if state.is_chunking(s, self.rid):
                return "chunking"
            if any(r.rid == self.rid for r in getattr(s, "waiting_queue", ())):
                return "waiting"
            return "running"
        known = self._ctx._driver.tracker.reqs.get(self.rid)
        if known is not None:
            reason = getattr(known, "finished_reason", None)
            if _is_abort(reason):
                return "aborted"
            if reason is None and self.rid not in self._ctx._driver.tracker.abort_matched:
                return "lost"
            return "finished"
        if self.rid in self._ctx._driver.tracker.ingested:
            return "aborted"  # rejected at ingest; self.http says why
        return "posted"

    @property
    def finished(self) -> bool:
        return self.status in ("finished", "aborted")

    @property
    def is_chunking(self) -> bool:
        return state.is_chunking(self._ctx.scheduler, self.rid)

    @property
    def chunks_done(self) -> int:
        """Prefill (extend) forwards launched for this request so far."""
        return sum(
            1
            for rec in self._ctx.batch_log
            if rec.mode == "extend" and self.rid in rec.rids
        )

    # --- what it holds ---------------------------------------------------------
    @property
    def req_pool_idx(self) -> Optional[int]:
        req = self.req
        return None if req is None else state.req_pool_idx(req)

    @property
    def kv_pages(self) -> int:
        req = self.req
        if req is None or not state.holds_kv(req):
            return 0
        page = self._ctx.engine_stats()["page_size"]
        return (state.kv_allocated_len(req) + page - 1) // page

    @property
    def lock_refs(self) -> int:
        req = self.req
        if req is None:
            return 0
        return radix.node_lock_ref(self._ctx.scheduler.tree_cache, getattr(req, "last_node", None))

    @property
    def output_ids(self) -> List[int]:
        req = self.last_req
        return list(getattr(req, "output_ids", []) or []) if req is not None else []

    @property
    def finish_reason(self) -> Optional[str]:
        req = self.last_req
        reason = getattr(req, "finished_reason", None) if req is not None else None
        return None if reason is None else type(reason).__name__

    def __repr__(self) -> str:
        return f"ReqHandle({self.rid!r}, status={self.status})"
