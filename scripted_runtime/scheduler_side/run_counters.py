"""What the running script has used so far: its steps, the driver's
iterations, the forwards launched and the seconds spent waiting on HTTP.

The driver owns one ``RunCounters`` and advances it; the script context,
the request handles, the step observer and the control ledger are handed
the same object and read it.
"""
from __future__ import annotations

from typing import Any, List, NamedTuple, Optional, Sequence, Tuple

from scripted_runtime.hooks import sglang_compat


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
    # id() of each launched Req, as launched: tells a request from an earlier one of the same rid
    # (a reused rid); () where a record was built without them (a test's)
    req_ids: Tuple[int, ...] = ()
    # requests the (micro)batch's running batch held as this prefill launched (what admission
    # counted against the micro-batch limit); -1 for other forwards and records without it
    running: int = -1
    # priority scheduling on (None otherwise), for a prefill: the launched requests' and the waiting
    # queue's sglang_compat.priority_entry as admission left them, and when the iteration's
    # admission could start (perf_counter, the clock SGLang stamps a queue entry with)
    priority_pass: Optional[Tuple[Tuple[Any, ...], Tuple[Any, ...], float]] = None
    # a prefill the driver saw admitted (``Driver.after_prefill_pass``): the (free, evictable, page)
    # KV its pass began with and (rid, extend, new tokens charged) of each request the pass
    # admitted (not the continuing chunked request); None where the pass was not judged
    admission: Optional[Tuple[Tuple[int, int, int], Tuple[Tuple[str, int, int], ...]]] = None
    # an extend the fill_ids contract judged (``Driver.fill_ids_judged``): each launched request whose
    # fill ids were not its prompt followed by its output (``sglang_compat.fill_ids_desync``)
    fill_desync: Tuple[Tuple[str, int, int, int, int], ...] = ()

    def preempted(self) -> List[Tuple[Any, ...]]:
        """The priority entries (``sglang_compat.priority_entry``) of the
        requests this prefill's admission preempted: retracted and queued
        again after the iteration's intake (``Driver.after_ingest``), where
        only ``PrefillAdder.preempt_to_schedule`` queues a retracted request.
        [] without priority scheduling."""
        if self.priority_pass is None:
            return []
        _, waiting, intake = self.priority_pass
        return [e for e in waiting if e[3] and e[2] >= intake]

    def rows_taken_in_flight(self) -> List[Tuple[str, str, int]]:
        """(new rid, in-flight rid, row): a row this batch uses that a
        different request's still-unprocessed forward was launched with."""
        taken = []
        for rid, row in zip(self.rids, self.rows):
            for old_rid, old_row in self.in_flight:
                if row is not None and row == old_row and rid != old_rid:
                    taken.append((rid, old_rid, row))
        return taken


class RunCounters:
    def __init__(self) -> None:
        self.step = 0  # iterations the current script has run (ctx.step)
        self.iteration = 0  # iterations since the driver started
        self.batch_log: List[BatchRecord] = []  # one record per forward launched (ctx.batch_log)
        self.io_s = 0.0  # seconds the current script spent in HTTP posts and arrival waits


def admitted_in_pass(reqs: Sequence[Any], extend_lens: Optional[Sequence[int]], continued: Any,
                     chunked: Any) -> Tuple[Tuple[str, int, int], ...]:
    """(rid, extend, new tokens charged) of each request a pass admitted into
    the batch of ``reqs`` (``extend_lens`` the batch's, aligned with them):
    all but ``continued`` (the chunked request the pass continued), and no
    new tokens for ``chunked`` (the request the pass leaves chunked)."""
    admitted = []
    for i, req in enumerate(reqs):
        if req is continued:
            continue
        extend = int(extend_lens[i]) if extend_lens is not None else int(getattr(req, "extend_input_len", 0))
        admitted.append((req.rid, extend, 0 if req is chunked else sglang_compat.admitted_new_tokens(req)))
    return tuple(admitted)
