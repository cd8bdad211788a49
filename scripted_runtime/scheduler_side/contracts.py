"""Contracts of the control operations (scheduler process): what an operation
*means*, checked every iteration next to the invariants.

The invariants say the scheduler's state is consistent; a contract says an
operation did what SGLang says it does. Each rule below is read off SGLang
0.5.23 (``scheduler.py``: ``pause_generation``, ``continue_generation``,
``abort_request``, ``flush_cache``; ``weight_updater.py``; PR 10071 for the
pause modes) and off what the **normal** loop does; where the overlap or PP
loop does otherwise, the contract reports it (a finding), it does not bend.

* ``pause``: from the iteration that processes ``pause_generation``
  (``in_place`` or ``retract``) until a ``continue_generation`` is
  processed, no forward is launched and no request gains an output token.
  What may still complete: nothing on the normal loop (nothing is in
  flight); on the overlap loop a ``retract`` pause processes the batch in
  flight inside its handler (up to one token per request, counted before the
  rule starts), an ``in_place`` pause leaves it unprocessed in
  ``result_queue`` until continue; on the PP loop the forwards already
  launched in the other microbatch slots (their tokens are counted for one
  round of slots before the token rule starts). After a ``retract`` the handler has
  emptied ``running_batch``, ``last_batch``, ``chunked_req`` and
  ``result_queue``: every request it took out waits in ``waiting_queue``
  without a ``req_to_token`` row. (``pause_generation(abort)`` never reaches
  the scheduler: the tokenizer turns it into aborts.)
* ``continue``: after ``continue_generation`` is processed, live work moves
  again: within ``CONTINUE_ITERATIONS`` x slots iterations a forward is
  launched or every live request finished (unless the engine was paused
  again, or a script holds KV with ``ctx.exhaust_kv``).
* ``abort``: a request an ``abort_request`` matched (rid prefix, as SGLang
  matches, or all) takes part in at most ``ABORT_DECODE_LAUNCHES`` decode
  forwards launched from the abort's iteration on before it is finished
  with ``FINISH_ABORT`` (a running request finishes at its next decode;
  prefills of other requests may run first, and SGLang schedules them
  first, so iterations are not the measure); it is finished, or dropped
  from the waiting queue, within ``ABORT_ITERATION_CAP`` x slots unpaused
  iterations (a running request's abort waits for ``continue`` during a
  pause); once seen finished it is never launched again; once the scheduler
  holds it nowhere it holds no ``req_to_token`` row, and only a request
  that was waiting when the abort came may vanish without a finish reason.
* ``flush``: a ``flush_cache`` is accepted only when no live request holds
  KV (what SGLang's idle gate promises); an accepted one leaves the tree
  empty, every row free and every KV slot available, right after it ran; a
  refused one changes nothing (tree, rows, KV as before). And it is not
  refused when the engine holds nothing to protect (``must_accept``, the
  harness's own scan): no request, finished or not, in any batch, the
  chunked slot, the result queue or a PP slot, no waiting request holding
  KV, and the waiting queue empty, or, during a pause on a release whose
  flush lets waiting requests be (0.5.21+: ``flush_cache`` asks
  ``is_fully_idle(ignore_waiting=self._engine_paused)``, PR 10071's RL
  flow: pause with retract, flush, update, continue), only waiting
  requests. Not judged with HiCache on (a pending copy also keeps the gate
  shut). Under PP it is judged on the driver rank, whose flush answers the
  client: its gate adds the micro-batch slots (``_pp_microbatches_drained``:
  every ``running_mbs`` and ``mbs`` entry empty), which the scan reads too
  (and ``last_mbs`` besides).
* ``update_weights``: ``update_weights_from_disk(flush_cache=True)`` (and
  ``update_weights_from_tensor``'s and ``update_weights_from_distributed``'s,
  which flush the same way) that
  answers success was processed with no live request holding KV and
  leaves the pools as an accepted flush does; one that
  answers failure (the flush was refused: 0.5.22+) changed no pool, and
  is not refused when nothing is held (as ``flush``), unless its own
  precondition failed first (a tensor or distributed update outside a
  begin/end session, a distributed one over a group not joined); and one
  that answers success serves the checkpoint it loaded: the weights'
  fingerprint equals the one that checkpoint's load gave in the output
  oracle's warm-up (judged where the harness knows both: a disk update of
  a checkpoint the warm-up loaded, a tensor or distributed update ``ctx``
  posted from one; the oracle keys references by the weights served, so
  without this rule an update that loads nothing and answers success
  passes). 0.5.23
  processes a weight update in any scheduler state, so no state is
  forbidden.
* ``memory_occupation``: a ``release_memory_occupation`` naming
  ``kv_cache`` (or no tag: all) leaves the pools as an accepted flush does
  right after it (SGLang flushes because the region's content is gone);
  after a release SGLang's ``offload_tags`` holds every tag it named, after
  a resume none of them; a resume of ``weights`` leaves the model's buffers
  (its static state: rotary caches) as they were when the release came
  (SGLang stashes them at the release and imports them at the resume; on
  the CPU default the harness overwrites them in between, as a GPU loses
  them); and while ``kv_cache`` or ``weights`` is released
  no forward is launched (on a GPU it would run over unmapped memory; the
  client's part is to pause first, which the harness's ``ctx`` enforces,
  so a forward there is the scheduler running work it holds).

Bookkeeping (``ContractMemory.on_dispatch``) runs only when a control
request is dispatched; the per-iteration checks are a few comparisons
unless a pause or abort is pending. The five are one check ``check(view,
mem) -> Optional[Violation]`` registered in ``check_registry`` under each
contract's name (``@check_registry.contract``): it runs once an iteration
when any of them is on, and skips the rules of those that are off.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from scripted_runtime.hooks import sglang_compat
from scripted_runtime.scheduler_side import check_registry, hicache_state, memory_occupation, state, update_sources
from scripted_runtime.scheduler_side.check_registry import Violation

NAMES = ("pause", "continue", "abort", "flush", "update_weights", "memory_occupation")
DOCS = {
    "pause": "from a processed pause_generation until continue, no forward is launched and no request gains a token",
    "continue": "after continue_generation, live work moves again within a few iterations",
    "abort": "an aborted request finishes (FINISH_ABORT) within a bound, is never launched again and keeps no row",
    "flush": "flush_cache is accepted only with no live KV, and then empties the pools; a refused one changes nothing",
    "update_weights": "update_weights_from_disk/_from_tensor(flush_cache=True) leave the pools as the flush they "
                      "answer says",
    "memory_occupation": "release(kv_cache) leaves the pools flushed; offload_tags follows release/resume; no "
                         "forward while KV or weights are released",
}

# Decode forwards an aborted request may still take part in: the one
# launched in the abort's own iteration (normal: it applies to_finish),
# plus, on the overlap and PP loops, one launched before the in-flight
# result that finishes it was processed.
ABORT_DECODE_LAUNCHES = {"normal": 1, "overlap": 2, "pp": 2}
# Unpaused iterations (x PP slots) within which an aborted request must be
# finished or gone: a loose bound, past any prefill queue a program builds.
ABORT_ITERATION_CAP = 100
CONTINUE_ITERATIONS = 4  # x slots

PAUSE_TYPE = "PauseGenerationReqInput"
CONTINUE_TYPE = "ContinueGenerationReqInput"
ABORT_TYPE = "AbortReq"
FLUSH_TYPE = "FlushCacheReqInput"
UPDATE_TYPE = "UpdateWeightFromDiskReqInput"
TENSOR_UPDATE_TYPE = "UpdateWeightsFromTensorReqInput"  # the same flush after the load (flush_cache_after_weight_update)
DISTRIBUTED_UPDATE_TYPE = sglang_compat.DISTRIBUTED_UPDATE_TYPE  # the same flush again
UPDATE_TYPES = (UPDATE_TYPE, TENSOR_UPDATE_TYPE, DISTRIBUTED_UPDATE_TYPE)
SESSION_UPDATE_TYPES = (TENSOR_UPDATE_TYPE, DISTRIBUTED_UPDATE_TYPE)  # refused outside a begin/end session
UPDATE_NAMES = {UPDATE_TYPE: "update_weights_from_disk", TENSOR_UPDATE_TYPE: "update_weights_from_tensor",
                DISTRIBUTED_UPDATE_TYPE: "update_weights_from_distributed"}
RELEASE_TYPE = "ReleaseMemoryOccupationReqInput"
RESUME_TYPE = "ResumeMemoryOccupationReqInput"
OBSERVED_TYPES = frozenset({PAUSE_TYPE, CONTINUE_TYPE, ABORT_TYPE, FLUSH_TYPE, *UPDATE_TYPES, RELEASE_TYPE, RESUME_TYPE})
# the released tags during which a forward would run over unmapped memory on a GPU
FORWARD_FORBIDDING_TAGS = ("kv_cache", "weights")


def pools(s: Any) -> Dict[str, Any]:
    """What a flush resets (tree tokens, free rows, free KV), and the live
    requests holding KV that an accepted flush would reset under."""
    stats = state.pool_stats(s)
    busy = tuple(r.rid for r in state.iter_reqs(s) if not r.finished() and state.holds_kv(r))
    return {"tree_tokens": stats["evictable"] + stats["protected"], "rows_free": stats["req_pool_free"],
            "kv_free": stats["kv_pool_free"], "busy": busy, "rows_total": stats["req_pool_total"],
            "kv_total": int(getattr(s, "max_total_num_tokens", 0) or stats["kv_pool_total"]),
            "must_accept": must_accept_flush(s)}


def _update_will_load(s: Any, name: str, recv_req: Any) -> bool:
    """Whether an update's own precondition holds, so that only its flush
    can refuse it: for a disk update, a checkpoint at its path (0.5.23
    answers ``success=False`` for a missing one, before loading or
    flushing); for a tensor or distributed one, a weight-update session open
    (the same answer without one) and, for a distributed one, the group
    joined."""
    if name == UPDATE_TYPE:
        return not update_sources.checkpoint_missing(getattr(recv_req, "model_path", None))
    if name == DISTRIBUTED_UPDATE_TYPE:
        return sglang_compat.distributed_update_receives(s, recv_req)
    return sglang_compat.weight_update_session_open(s)


def must_accept_flush(s: Any) -> Optional[str]:
    """Why a flush processed now must be accepted (the engine holds nothing
    a flush could reset under: the module docstring's ``flush`` rule), or
    None when a refusal is allowed. Read by the harness's own scan of the
    scheduler's places, not by SGLang's gate."""
    if hicache_state.controller(s) is not None:
        return None
    waiting: List[Any] = []
    for name, _, _, reqs in state.places(s):
        if name != "waiting_queue":
            if reqs:
                return None
        else:
            waiting = list(reqs)
    if any(state.holds_kv(r) for r in waiting):
        return None
    if not waiting:
        return "nothing is held anywhere"
    if sglang_compat.is_paused(s) and sglang_compat.flush_ignores_waiting_while_paused(s):
        return (f"the engine is paused and only waiting requests are held ({len(waiting)}, none holding KV), "
                "which this release's flush lets be (is_fully_idle(ignore_waiting=True))")
    return None


def not_flushed(after: Dict[str, Any]) -> List[str]:
    """What ``pools`` shows left over where a flush just ran: tree tokens,
    rows or KV not free (empty when the pools are as a flush leaves them)."""
    wrong = []
    if after["tree_tokens"]:
        wrong.append(f"{after['tree_tokens']} tokens still in the tree")
    if after["rows_free"] != after["rows_total"]:
        wrong.append(f"rows free {after['rows_free']}/{after['rows_total']}")
    if after["kv_free"] != after["kv_total"]:
        wrong.append(f"KV free {after['kv_free']}/{after['kv_total']}")
    return wrong


FINGERPRINT = ("tree_tokens", "rows_free", "kv_free")  # what a refused flush must leave as it was


def pools_changed(before: Dict[str, Any], after: Dict[str, Any]) -> List[str]:
    """``"name before -> after"`` for each part of ``FINGERPRINT`` that
    differs between two ``pools`` readings (what a refused flush or a query
    must leave as it was)."""
    return [f"{k} {before[k]} -> {after[k]}" for k in FINGERPRINT if before[k] != after[k]]


def matches_abort(recv_req: Any, rid: str) -> bool:
    """Whether an ``AbortReq`` applies to request ``rid``, as SGLang matches
    it: every request for ``abort_all``, else by rid prefix."""
    if getattr(recv_req, "abort_all", False):
        return True
    prefix = getattr(recv_req, "rid", "") or ""
    return bool(prefix) and rid.startswith(prefix)


@dataclass
class AbortWatch:
    rid: str
    req: Any
    dispatched_step: int
    waiting_only: bool  # held only by the waiting queue when the abort came (SGLang may drop it unfinished)
    unpaused_iterations: int = 0
    decode_launches: int = 0
    finished_step: Optional[int] = None


@dataclass
class ContractMemory:
    """What the contracts remember across the iterations of one run."""

    TYPES = OBSERVED_TYPES  # the control requests its dispatch bookkeeping looks at

    problems: List[Tuple[str, str]] = field(default_factory=list)  # found at dispatch: (contract, message)
    harness_error: Optional[str] = None  # the bookkeeping itself raised at dispatch (reported as HarnessError)
    pause_step: Optional[int] = None  # step the current pause was processed
    pause_mode: Optional[str] = None
    paused_lengths: Optional[Dict[str, int]] = None  # output lengths at the first check of the pause
    continue_step: Optional[int] = None  # last continue processed (while work was live)
    aborts: Dict[str, AbortWatch] = field(default_factory=dict)
    batch_cursor: int = 0  # batch_log entries already looked at
    stashed_buffers: Optional[Dict[str, Any]] = None  # the model's buffers when a release of weights came
    update_expects: Any = None  # the weights fingerprint the update being dispatched must leave, where known
    update_before: Any = None  # (weights fingerprint, served version label) before the update being dispatched

    # --- at dispatch (called by the driver's recording dispatcher) -----------
    def before_dispatch(self, s: Any, recv_req: Any) -> Any:
        """What the rule of this request needs from the state before SGLang
        processes it: the pools (flush, update with flush), the requests an
        abort matches and where they are held (abort)."""
        name = type(recv_req).__name__
        flush = getattr(recv_req, "flush_cache", False)
        will_load = name not in UPDATE_TYPES or _update_will_load(s, name, recv_req)
        if name in UPDATE_TYPES:
            self.update_expects = update_sources.expected_fingerprint(recv_req)
            # What a failed update must leave as it found it, where a failure can only mean that it did
            # not load: without a flush, or its own precondition failing. With a flush, 0.5.23 answers
            # failure also when it loaded the weights (and their label) and then its flush was refused.
            self.update_before = ((update_sources.weights_fingerprint(s), sglang_compat.served_weight_version())
                                  if not flush or not will_load else None)
        if name == FLUSH_TYPE or (name in UPDATE_TYPES and flush):
            before = pools(s)
            if not will_load:
                before["must_accept"] = None  # refused for its own precondition, before any flush
            return before
        if name == ABORT_TYPE:
            return _abort_targets(s, recv_req)
        if name == RELEASE_TYPE and "weights" in memory_occupation.tags_of(recv_req):
            self.stashed_buffers = _model_buffers(s)  # what SGLang stashes now, and its resume must put back
        return None

    def on_dispatch(self, s: Any, recv_req: Any, output: Any, step: int, before: Any) -> None:
        name = type(recv_req).__name__
        if name == PAUSE_TYPE:
            self._on_pause(s, recv_req, step)
        elif name == CONTINUE_TYPE:
            self.pause_step = self.pause_mode = self.paused_lengths = None
            self.continue_step = step
        elif name == ABORT_TYPE and before is not None:
            self._on_abort(before, step)
        elif name in (FLUSH_TYPE, *UPDATE_TYPES) and before is not None:
            self._on_flush(s, name, output, before)
        elif name in (RELEASE_TYPE, RESUME_TYPE):
            self._on_memory(s, recv_req, release=name == RELEASE_TYPE, step=step)
        if name in UPDATE_TYPES:  # besides its flush rule above
            self._on_update_loaded(s, name, output)

    def _on_pause(self, s: Any, recv_req: Any, step: int) -> None:
        mode = getattr(recv_req, "mode", None)
        if mode not in ("in_place", "retract"):
            return
        self.pause_step, self.pause_mode, self.paused_lengths = step, mode, None
        if mode != "retract":
            return
        left = []
        for name, _, _, reqs in state.places(s, pp_slots=()):
            if name in ("running_batch", "last_batch", "chunked_req", "result_queue"):
                left += [f"{r.rid} in {name}" for r in reqs if not r.finished()]
        rowed = [r.rid for r in getattr(s, "waiting_queue", ()) or () if state.req_pool_idx(r) is not None
                 and not r.finished()]
        if left:
            self.problems.append(("pause", f"pause_generation(retract) left live requests in the batches it "
                                           f"retracts: {', '.join(left[:6])}"))
        elif rowed and sglang_compat.loop_kind(s) != "pp":
            self.problems.append(("pause", f"pause_generation(retract) left waiting requests holding a "
                                           f"req_to_token row: {', '.join(rowed[:6])}"))

    def _on_memory(self, s: Any, recv_req: Any, *, release: bool, step: int) -> None:
        tags = memory_occupation.tags_of(recv_req)
        held = set(sglang_compat.released_memory_tags(s))
        what = f"{'release' if release else 'resume'}_memory_occupation({', '.join(tags)})"
        if release:
            missing = [t for t in tags if t not in held]
            if missing:
                self.problems.append(("memory_occupation", f"{what} processed at step {step}, yet SGLang's "
                                                           f"offload_tags lacks {', '.join(missing)}"))
            if "kv_cache" in tags:
                after = pools(s)
                wrong = not_flushed(after)
                if wrong:
                    self.problems.append(("memory_occupation", f"{what} released the KV cache, yet right after "
                                                               "it " + "; ".join(wrong)))
        else:
            left = [t for t in tags if t in held]
            if left:
                self.problems.append(("memory_occupation", f"{what} processed at step {step}, yet SGLang's "
                                                           f"offload_tags still holds {', '.join(left)}"))
            if "weights" in tags and self.stashed_buffers is not None:
                stashed, self.stashed_buffers = self.stashed_buffers, None
                now = _model_buffers(s) or {}
                changed = [n for n, t in stashed.items() if n not in now or not _same_tensor(now[n], t)]
                if changed:
                    self.problems.append(("memory_occupation", f"{what} did not put the model's buffers back as "
                                                               f"they were at the release: {', '.join(changed[:4])} "
                                                               "differ (SGLang stashes them at the release and "
                                                               "imports them at the resume)"))

    def _on_abort(self, targets: List[Tuple[Any, bool]], step: int) -> None:
        for req, waiting_only in targets:
            watch = self.aborts.get(req.rid)
            if watch is None:
                self.aborts[req.rid] = AbortWatch(req.rid, req, step, waiting_only=waiting_only)
            elif waiting_only:
                # aborted while running, retracted since, aborted again while waiting:
                # SGLang drops it from the waiting queue (found by the explorer)
                watch.waiting_only = True

    def _on_update_loaded(self, s: Any, name: str, output: Any) -> None:
        expected, self.update_expects = self.update_expects, None
        before, self.update_before = self.update_before, None
        success = getattr(output, "success", None)
        if success is False and before is not None:
            # 0.5.23 records an update's weight_version only once it loaded, and a disk update that fails
            # to load rolls the weights back ("Rolling back to original weights"): an update that did
            # not load serves what was served before it
            now = (update_sources.weights_fingerprint(s), sglang_compat.served_weight_version())
            what = UPDATE_NAMES[name]
            if now[1] != before[1]:
                self.problems.append(("update_weights", f"{what} answered failure, yet the served weight version "
                                                        f"changed from {before[1]!r} to {now[1]!r}"))
            elif now[0] != before[0]:
                self.problems.append(("update_weights", f"{what} answered failure, yet the weights served changed "
                                                        f"(fingerprint {before[0]} before it, {now[0]} after)"))
        if expected is None or not success:
            return
        served = update_sources.weights_fingerprint(s)
        if served != expected:
            what = UPDATE_NAMES[name]
            self.problems.append(("update_weights", f"{what} answered success, yet the weights served are not the "
                                                    f"checkpoint's it loaded (fingerprint {served}, that "
                                                    f"checkpoint's {expected} when the warm-up loaded it)"))

    def _on_flush(self, s: Any, name: str, output: Any, before: Dict[str, int]) -> None:
        contract = "flush" if name == FLUSH_TYPE else "update_weights"
        what = "flush_cache" if name == FLUSH_TYPE else f"{UPDATE_NAMES[name]}(flush_cache=True)"
        success = getattr(output, "success", None)
        if success is None:
            return
        after = pools(s)
        changed = pools_changed(before, after)
        if success and before["busy"]:
            self.problems.append((contract, f"{what} accepted while live requests held KV: "
                                            f"{', '.join(before['busy'][:6])} (SGLang's idle gate must refuse it)"))
        elif success:
            wrong = not_flushed(after)
            if wrong:
                self.problems.append((contract, f"{what} accepted, yet right after it " + "; ".join(wrong)))
        elif changed:
            self.problems.append((contract, f"{what} refused, yet the pools changed: {', '.join(changed)}"))
        elif before.get("must_accept"):
            self.problems.append((contract, f"{what} refused, though {before['must_accept']}"))


def _model_buffers(s: Any) -> Optional[Dict[str, Any]]:
    """Copies of this rank's model buffers (its "static state": rotary
    caches and the like, small), or None without a model."""
    model = sglang_compat.served_model(s)
    if model is None:
        return None
    return {name: b.detach().clone() for name, b in model.named_buffers()}


def _same_tensor(a: Any, b: Any) -> bool:
    import torch

    return a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(a, b))


def _abort_targets(s: Any, recv_req: Any) -> List[Tuple[Any, bool]]:
    """(request, held only by the waiting queue) for every unfinished request
    an ``AbortReq`` matches (SGLang: rid prefix, or all), before it runs."""
    where: Dict[int, List[str]] = {}
    reqs: Dict[int, Any] = {}
    for name, _, _, held in state.places(s):
        for req in held:
            where.setdefault(id(req), []).append(name)
            reqs[id(req)] = req
    return [(req, where[key] == ["waiting_queue"]) for key, req in reqs.items()
            if not req.finished() and matches_abort(recv_req, req.rid)]


def _lengths(view: Any, tracked: Dict[str, Any]) -> Dict[str, int]:
    out = {r.rid: len(r.output_ids) for r in view.reqs}
    for rid, req in tracked.items():
        out.setdefault(rid, len(getattr(req, "output_ids", ()) or ()))
    return out


def _broken(view: Any, contract: str, message: str, reqs: List[Any]) -> Violation:
    return Violation(contract, message, view.owner_info(reqs))


@check_registry.contract(*NAMES, docs=DOCS)
def check(view: Any, memory: Any) -> Optional[Violation]:
    """The first broken contract (only those ``memory.step_inputs.enabled``),
    or None. ``memory``: the run's ``invariants.InvariantMemory``, holding
    the contracts' own (``memory.contracts``) and this step's inputs."""
    mem: ContractMemory = memory.contracts
    inputs = memory.step_inputs
    step, tracked, enabled = inputs.step, inputs.tracked, inputs.enabled
    if mem.harness_error:
        error, mem.harness_error = mem.harness_error, None
        raise RuntimeError(f"the contracts' bookkeeping failed at a dispatch: {error}")
    launched = inputs.launched_since(mem)
    while mem.problems:
        contract, message = mem.problems.pop(0)
        if enabled(contract):
            mem.problems.clear()
            return _broken(view, contract, message, [])
    slots = max(1, state.mbs_slots(view.s))
    if launched and enabled("memory_occupation"):
        released = [t for t in sglang_compat.released_memory_tags(view.s) if t in FORWARD_FORBIDDING_TAGS]
        if released:
            b = launched[0]
            return _broken(view, "memory_occupation",
                           f"a {b.mode} forward of [{', '.join(b.rids[:6])}] was launched at step {b.step} while "
                           f"{' and '.join(released)} memory was released (a GPU would run it over unmapped memory)",
                           [r for r in view.reqs if r.rid in b.rids])
    paused = mem.pause_step is not None
    if paused and enabled("pause"):
        during = [b for b in launched if b.step >= mem.pause_step]
        if during:
            b = during[0]
            return _broken(view, "pause",
                           f"a {b.mode} forward of [{', '.join(b.rids[:6])}] was launched at step {b.step}"
                           + (f" (PP slot {b.slot})" if b.slot is not None else "")
                           + f", while paused ({mem.pause_mode}) since step {mem.pause_step}",
                           [r for r in view.reqs if r.rid in b.rids])
        # Forwards launched before the pause may still deliver: on the PP loop
        # one per slot, within a round; the baseline is taken after it.
        grace = slots if view.loop == "pp" else 0
        now = _lengths(view, tracked) if step >= mem.pause_step + grace else None
        if now is None:
            pass
        elif mem.paused_lengths is None:
            mem.paused_lengths = now
        else:
            grew = [(rid, mem.paused_lengths.get(rid, 0), n) for rid, n in now.items()
                    if n > mem.paused_lengths.get(rid, 0)]
            if grew:
                rid, a, b = grew[0]
                return _broken(view, "pause", f"request {rid} went from {a} to {b} output tokens while paused "
                                              f"({mem.pause_mode}) since step {mem.pause_step}",
                               [r for r in view.reqs if r.rid == rid])
    if mem.continue_step is not None and enabled("continue"):
        unfinished = [r for r in view.reqs if not r.finished()]
        if paused or launched or not unfinished or view.extra_held_tokens:
            mem.continue_step = None  # moved, paused again, nothing to move, or no room a script took
        elif step - mem.continue_step >= CONTINUE_ITERATIONS * slots:
            since = mem.continue_step
            mem.continue_step = None
            return _broken(view, "continue",
                           f"continue_generation processed at step {since}, yet no forward was launched "
                           f"in {step - since} iterations with {len(unfinished)} unfinished request(s): "
                           + ", ".join(f"{r.rid} in {'+'.join(view.holders_of(r))}" for r in unfinished[:6]),
                           unfinished[:6])
    if mem.aborts and enabled("abort"):
        return _check_aborts(view, mem, launched, slots, paused, step)
    return None


def _check_aborts(view: Any, mem: ContractMemory, launched: List[Any], slots: int,
                  paused: bool, step: int) -> Optional[Violation]:
    loop = view.loop
    cap = ABORT_ITERATION_CAP * slots
    allowed = ABORT_DECODE_LAUNCHES.get(loop, 2)
    held = {id(r) for r in view.reqs}
    for rid, w in list(mem.aborts.items()):
        req = w.req
        # this Req's launches (a later request reusing the rid is another request)
        mine = [b for b in launched if (id(req) in b.req_ids if b.req_ids else rid in b.rids)
                and b.step >= w.dispatched_step]
        if w.finished_step is not None:
            again = [b for b in mine if b.step > w.finished_step]
            if again:
                return _broken(view, "abort",
                               f"request {rid}, finished by abort at step {w.finished_step}, was launched "
                               f"again in a {again[0].mode} forward at step {again[0].step}", [req])
        elif not req.finished():
            w.decode_launches += sum(1 for b in mine if b.mode == "decode")
            if w.decode_launches > allowed:
                return _broken(view, "abort",
                               f"request {rid} took part in {w.decode_launches} decode forwards after its abort "
                               f"was processed at step {w.dispatched_step} and is still not finished (at most "
                               f"{allowed} on the {loop} loop)", [req])
        if id(req) not in held:
            row = state.req_pool_idx(req)
            if row is not None and row not in set(getattr(view.s.req_to_token_pool, "free_slots", ()) or ()):
                return _broken(view, "abort",
                               f"aborted request {rid} is held nowhere but still holds req_to_token row {row}", [req])
            if not req.finished() and not w.waiting_only:
                return _broken(view, "abort",
                               f"aborted request {rid} vanished from the scheduler without a finish reason; it "
                               "was running when the abort came (only a waiting request is dropped so)", [req])
            del mem.aborts[rid]
            continue
        if req.finished():
            if w.finished_step is None:
                w.finished_step = step
            continue
        if not paused:
            w.unpaused_iterations += 1
        if w.unpaused_iterations > cap:
            return _broken(view, "abort",
                           f"request {rid} is still live {w.unpaused_iterations} iterations after its abort was "
                           f"processed at step {w.dispatched_step} (at most {cap} on the {loop} loop)", [req])
    return None
