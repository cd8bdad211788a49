"""The requests a script started, as the scheduler saw them: kept by the
driver (fed from the dispatcher and ``run_batch``), read by the request
handles, the step observer and the script context."""
from __future__ import annotations

from typing import Any, Dict, List, Tuple

from scripted_runtime.scheduler_side.contracts import matches_abort


class RequestTracker:
    """Keeps the Req object of every request a script started, so a handle
    can still report how it ended after the scheduler has let go of it."""

    def __init__(self) -> None:
        self.reqs: Dict[str, Any] = {}
        # rid -> how many requests of that rid the scheduler took in (a reused rid counts twice)
        self.ingested: Dict[str, int] = {}
        # rid -> the Req of each request of that rid as the scheduler took it in, in order (None
        # for one it rejected at ingest): a handle's own is the one at its place in this list
        self.by_ingest: Dict[str, List[Any]] = {}
        # the ReqHandles the running script started, in order (the trace's "started")
        self.handles: List[Any] = []
        # rids an abort_request matched as it was processed: SGLang drops an
        # aborted waiting request without a finish reason
        self.abort_matched: set = set()
        # rid -> the prefix (tokens) its first extend forward started from: its prefix-cache hit
        self.first_prefix: Dict[str, int] = {}
        # id(Req) -> where each of its extend forwards ended (prompt tokens), in launch order:
        # its chunk boundaries as scheduled (a chunk shares the budget with the batch's other
        # requests, and a retracted request is recomputed from its cached prefix)
        self.extend_ends: Dict[int, List[int]] = {}
        # id(Req) -> (the version served before, how many output tokens it had) at each change of
        # the served weight version while it was unfinished with output: the boundaries SGLang's
        # record_weight_version_change must record on it (its live set: in flight, chunked, waiting)
        self.version_events: Dict[int, List[Tuple[str, int]]] = {}
        # id(Req) -> the weight version served when it finished, noted at the first change after it
        # (none: the version served now)
        self.finish_version: Dict[int, str] = {}

    def clear(self) -> None:
        self.reqs.clear()
        self.ingested.clear()
        self.by_ingest.clear()
        self.handles.clear()
        self.abort_matched.clear()
        self.first_prefix.clear()
        self.extend_ends.clear()
        self.version_events.clear()
        self.finish_version.clear()

    def on_abort(self, abort_req: Any, scheduler: Any) -> None:
        """An ``AbortReq`` is about to be processed: remember which waiting
        requests it matches (SGLang matches by rid prefix, or all; it drops
        a matched waiting request without a finish reason, while a running
        one is finished with FINISH_ABORT)."""
        for req in getattr(scheduler, "waiting_queue", ()) or ():
            if matches_abort(abort_req, req.rid):
                self.abort_matched.add(req.rid)

    def on_ingested(self, rid: str, scheduler: Any) -> None:
        self.ingested[rid] = self.ingested.get(rid, 0) + 1
        taken = None
        for req in reversed(list(getattr(scheduler, "waiting_queue", ()) or ())):
            if req.rid == rid:
                self.reqs[rid] = taken = req
                break
        self.by_ingest.setdefault(rid, []).append(taken)

    def on_batch(self, reqs: Any, prefix_lens: Any = None, extend_lens: Any = None) -> None:
        """A forward launched with these requests; ``prefix_lens``: an extend
        batch's ``ScheduleBatch.prefix_lens`` (where each request's extend
        starts, the ``pre_len`` SGLang counts cached tokens from);
        ``extend_lens``: its ``extend_lens`` (how many tokens each extends)."""
        for req in reqs or ():
            self.reqs.setdefault(req.rid, req)
        if prefix_lens is not None:
            for req, pre_len in zip(reqs or (), prefix_lens):
                self.first_prefix.setdefault(req.rid, int(pre_len))
            if extend_lens is not None:
                for req, pre_len, ext in zip(reqs or (), prefix_lens, extend_lens):
                    self.extend_ends.setdefault(id(req), []).append(int(pre_len) + int(ext))

    def on_version_change(self, old: Any, new: Any) -> None:
        """A control request just changed the served weight version from
        ``old`` to ``new`` (``update_weight_version``, or a weight update
        carrying ``weight_version``): note, for every request taken in, the
        boundary its answer's ``weight_versions`` must show (an unfinished
        one with output: the tokens it has were made under ``old``), or the
        version it finished under (a finished one: ``old``, if not noted at
        an earlier change). A request with no output yet has no boundary:
        all its tokens will be made under a later version. Nothing when the
        version did not change."""
        if old == new or old is None:
            return
        seen = set()
        for req in [*self.reqs.values(), *(r for taken in self.by_ingest.values() for r in taken)]:
            if req is None or id(req) in seen:
                continue
            seen.add(id(req))
            if getattr(req, "finished_reason", None) is not None:
                self.finish_version.setdefault(id(req), old)
            elif getattr(req, "output_ids", None):
                self.version_events.setdefault(id(req), []).append((old, len(req.output_ids)))
