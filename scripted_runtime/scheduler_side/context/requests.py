"""Request handles returned by ``ctx.start_req``."""
from __future__ import annotations

from typing import Any, List, Optional

from scripted_runtime.hooks import sglang_compat
from scripted_runtime.scheduler_side import state
from scripted_runtime.scheduler_side.context import radix
from scripted_runtime.scheduler_side.http_poster import HttpAnswer
from scripted_runtime.scheduler_side.request_tracker import RequestTracker
from scripted_runtime.scheduler_side.run_counters import RunCounters


def _is_abort(reason: Any) -> bool:
    return reason is not None and type(reason).__name__ == "FINISH_ABORT"


class ReqHandle:
    """A request started by a script. Every property reads live state: the
    scheduler, the tracker (the Req as last held) and the run's batch log."""

    def __init__(self, rid: str, http: HttpAnswer, posted_step: int, *,
                 scheduler: Any, tracker: RequestTracker, counters: RunCounters, raw: bool = False,
                 payload: Optional[dict] = None):
        self._scheduler = scheduler
        self._tracker = tracker
        self._counters = counters
        self.rid = rid
        self.http = http  # the /generate answer, once the request completes
        self.posted_step = posted_step
        # Sent as given (``ctx.send_generate``): judged by the survival contract, not by the
        # checks that assume start_req's shape. ``payload``: what was posted.
        self.raw = raw
        self.lora: Optional[str] = None  # the LoRA adapter it names (ctx.start_req(lora=...))
        # its request reached the scheduler's socket (seen while the post waited for it): SGLang's
        # tokenizer forwarded it, so it holds the tokenizer's lock until answered, even "posted"
        self.arrived = False
        # A session turn's whole prompt as the client's history makes it (ctx.start_req(session=...)):
        # what the output oracle compares it against, instead of SGLang's own record of it
        self.expected_prompt: Optional[list] = None
        self.session: Optional[str] = None  # the session it is a turn of (ctx.start_req(session=...))
        self.max_new_tokens: Optional[int] = None
        self.logprob_start_len: Optional[int] = None  # as posted (ctx.start_req); None: SGLang's default
        self.priority: Optional[int] = None  # as posted (ctx.start_req); None: none sent
        # What the output oracle compared it with ({"compared": tokens, "logprobs": the reference's}),
        # set by output_oracle.check_outputs for the logprob contract
        self.oracle_reference: Optional[dict] = None
        self.payload = payload
        self.fuzz_cases: tuple = ()  # the field cases a fuzzed request was built from (request_fuzz)
        # A request of the same rid this one's post found (a reused rid, ``ctx.send_generate``):
        # its Req, held or recorded, is not this request's.
        self._earlier_req = state.find_req(scheduler, rid) or tracker.reqs.get(rid)
        self._ingested_before = tracker.ingested.get(rid, 0)

    def session_history(self, new_input_ids: list) -> Optional[list]:
        """The prompt of a session turn continuing after this request, as a
        client's conversation makes it: this request's whole prompt, the
        output it was answered (cut at its ``max_new_tokens``), then
        ``new_input_ids``. None while this request has not finished (SGLang
        aborts such a turn), when it ended without a finish reason (an abort
        dropped it from the waiting queue: SGLang aborts the turn too), or
        when its prompt is not known."""
        if self.status != "finished" or self.finish_reason is None:
            return None
        prompt = self.expected_prompt
        if prompt is None:
            req = self.last_req
            prompt = list(getattr(req, "origin_input_ids", ()) or ()) if req is not None else None
        if not prompt:
            return None
        output = list(self.output_ids)
        if self.max_new_tokens is not None:
            output = output[:self.max_new_tokens]
        return list(prompt) + output + list(new_input_ids)

    # --- where it is ---------------------------------------------------------
    @property
    def req(self) -> Optional[Any]:
        """The live Req object while the scheduler holds it, else None."""
        mine = self._mine()
        if mine is not None:
            return mine if state.holds(self._scheduler, mine) else None
        req = state.find_req(self._scheduler, self.rid)  # not taken in yet, or past the tracker
        return None if req is not None and req is self._earlier_req else req

    @property
    def last_req(self) -> Optional[Any]:
        """The Req object as last held (kept after the scheduler released it)."""
        return self.req or self._known()

    def _mine(self) -> Optional[Any]:
        """This request's Req as the scheduler took it in (by its place among
        the requests of its rid: a reused rid's earlier request is not it)."""
        taken = self._tracker.by_ingest.get(self.rid) or ()
        return taken[self._ingested_before] if len(taken) > self._ingested_before else None

    def _known(self) -> Optional[Any]:
        mine = self._mine()
        if mine is not None:
            return mine
        known = self._tracker.reqs.get(self.rid)
        return None if known is self._earlier_req else known

    @property
    def holders(self) -> List[str]:
        return state.where_is(self._scheduler, self.rid)

    @property
    def status(self) -> str:
        """posted | waiting | chunking | running | finished | aborted | lost | refused

        ``lost``: the scheduler took the request in, holds it nowhere now,
        and never finished it (no finish reason): dropped without an answer.
        ``refused``: the HTTP server answered without ever sending it to the
        scheduler (its validation refused it; ``self.http`` says why)."""
        s = self._scheduler
        req = self.req
        if req is not None:
            if req.finished():
                return "aborted" if _is_abort(req.finished_reason) else "finished"
            if state.is_chunking(s, self.rid):
                return "chunking"
            if any(r.rid == self.rid for r in getattr(s, "waiting_queue", ())):
                return "waiting"
            return "running"
        known = self._known()
        if known is not None:
            reason = getattr(known, "finished_reason", None)
            if _is_abort(reason):
                return "aborted"
            if reason is None and self.rid not in self._tracker.abort_matched:
                # SGLang's own abort, no client's: ``retract_decode`` aborts the last request of a
                # decode batch that cannot fit even alone ("Out of memory even after retracting all
                # other requests"), sets ``to_finish`` and sends the abort answer itself, without a
                # finish reason on the Req (met under PP, where each micro-batch retracts alone)
                return "aborted" if _is_abort(getattr(known, "to_finish", None)) else "lost"
            return "finished"
        if self._tracker.ingested.get(self.rid, 0) > self._ingested_before:
            return "aborted"  # rejected at ingest; self.http says why
        if self.http.done:
            return "refused"
        return "posted"

    @property
    def first_prefix_len(self) -> Optional[int]:
        """The prefix its first extend forward started from (its prefix-cache
        hit, in tokens); None before it ran one."""
        return self._tracker.first_prefix.get(self.rid)

    @property
    def weight_version_record(self) -> tuple:
        """(the weight-version changes seen while it was unfinished with
        output, each ``(version before, output tokens it had)``; the version
        served when it finished, or None where no change came after its
        finish): ``RequestTracker.on_version_change``."""
        req = self._known()
        if req is None:
            return [], None
        return list(self._tracker.version_events.get(id(req), ())), self._tracker.finish_version.get(id(req))

    @property
    def extend_ends(self) -> List[int]:
        """Where each of its extend (prefill) forwards ended, in prompt
        tokens, in launch order: its chunk boundaries as SGLang scheduled
        them (a recompute after a retract starts again); [] before one ran."""
        req = self._known()
        return list(self._tracker.extend_ends.get(id(req), ())) if req is not None else []

    @property
    def finished(self) -> bool:
        return self.status in ("finished", "aborted", "refused")

    @property
    def is_chunking(self) -> bool:
        return state.is_chunking(self._scheduler, self.rid)

    @property
    def chunks_done(self) -> int:
        """Prefill (extend) forwards launched for this request so far."""
        return sum(
            1
            for rec in self._counters.batch_log
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
        page = state.engine_stats(self._scheduler)["page_size"]
        return (state.kv_allocated_len(req) + page - 1) // page

    @property
    def lock_refs(self) -> int:
        req = self.req
        if req is None:
            return 0
        return radix.node_lock_ref(self._scheduler.tree_cache, getattr(req, "last_node", None))

    @property
    def output_ids(self) -> List[int]:
        req = self.last_req
        return list(getattr(req, "output_ids", []) or []) if req is not None else []

    @property
    def top_logprobs(self) -> Optional[List[List[float]]]:
        """The k best logprobs of every output token, best first, for a
        request started with ``top_logprobs=k``; None otherwise."""
        req = self.last_req
        return sglang_compat.output_top_logprobs(req) if req is not None else None

    @property
    def finish_reason(self) -> Optional[str]:
        req = self.last_req
        reason = getattr(req, "finished_reason", None) if req is not None else None
        return None if reason is None else type(reason).__name__

    def __repr__(self) -> str:
        return f"ReqHandle({self.rid!r}, status={self.status})"
