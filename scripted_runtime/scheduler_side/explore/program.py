"""Helpers that explored programs (and the scenario files written from them)
call, next to the plain context API. They run in the scheduler process.

Each one is deterministic in iterations: what it does depends only on
scheduler state, never on wall-clock timing, so a program replays the same
way on the same build.
"""
from __future__ import annotations

import inspect

from typing import Any, Dict, List, Optional

from scripted_runtime.scheduler_side import control, hicache_state, output_oracle, request_contract, state

# Iterations the end-state check allows for every request to finish (and then
# for the engine to go idle), per PP microbatch slot.
END_FINISH_STEPS = 400
END_IDLE_STEPS = 60
# Iterations update_weights waits for the requests to finish before it gives up
# (the tokenizer holds a weight update behind every running generate request).
UPDATE_WAIT_STEPS = 60
# Seconds to wait for the tokenizer's answer to a processed weight update.
UPDATE_ANSWER_TIMEOUT_S = 30.0


class UpdateAnswerTimeout(AssertionError):
    """The tokenizer did not answer a weight update the scheduler had processed."""


class EndStateError(AssertionError):
    """A program ended with the engine not back to a clean idle state."""


def _slots(ctx) -> int:
    return max(1, state.mbs_slots(ctx.scheduler))


def tokenizer_paused(ctx, ops=None) -> bool:
    """Whether the tokenizer holds new requests: the last pause/continue the
    program sent (of ``ops``, default all so far) was a pause; the scheduler
    learns of it one iteration later."""
    return control.pause_posted_last(ctx.control_ops if ops is None else ops)


def live(reqs) -> List[Any]:
    return [h for h in reqs if not h.finished]


def abort_one(ctx, reqs, pick: int):
    """Abort live request ``pick`` (modulo their number); None when none is live."""
    alive = live(reqs)
    if not alive:
        return None
    return ctx.abort(alive[pick % len(alive)])


def flush_cache(ctx):
    """``yield from flush_cache(ctx)``: ``ctx.flush_cache()``, after stepping
    until an earlier flush was processed (the tokenizer sends one at a time)."""
    for _ in range(4 * _slots(ctx)):
        if not ctx.unprocessed_ops("flush_cache"):
            break
        yield
    return ctx.flush_cache()


def update_weights(ctx, reqs, *, flush_cache: bool, max_steps: Optional[int] = None):
    """``yield from update_weights(ctx, reqs, flush_cache=...)``: post
    update_weights_from_disk so that it reaches the scheduler before the next
    iteration. While paused the tokenizer sends it at once; otherwise it waits
    behind every running request, so first step (bounded) until all of them
    finished in the scheduler. The op is processed in the next iteration
    (the one that would prune the finished requests: issue 14062's window).
    Until the tokenizer has answered the update it holds new generate
    requests back, so this then waits for that answer (which needs no further
    iteration) without stepping. Returns the op, or None when the requests
    did not finish in time."""
    if not tokenizer_paused(ctx):
        budget = (max_steps or UPDATE_WAIT_STEPS) * _slots(ctx)
        for _ in range(budget):
            if not live(reqs):
                break
            yield
        if live(reqs):
            return None
    op = ctx.update_weights_from_disk(flush_cache=flush_cache, await_arrival=True)
    yield from op.wait(max_steps=2 * _slots(ctx))
    if not op.http.wait(UPDATE_ANSWER_TIMEOUT_S):
        raise UpdateAnswerTimeout(f"update_weights_from_disk was processed at step {op.processed_step} but the "
                                  f"tokenizer did not answer within {UPDATE_ANSWER_TIMEOUT_S:.0f}s; "
                                  f"state: {ctx.describe()}")
    return op


def end_state_checks(ctx, reqs) -> Dict[str, Any]:
    """``yield from end_state_checks(ctx, reqs)``: resume a pause left open,
    then require every request to finish or abort, the engine to go idle
    (the scheduler's gate and the harness's scan agree), the pools to be
    whole (every row free, KV all free or evictable, no tree lock held), and
    every greedy request's tokens to be its reference's (the output oracle,
    ``scheduler_side/output_oracle.py``; off with the check name
    ``greedy_output``), and every ended request's answer to agree with its
    own sampling parameters (``scheduler_side/request_contract.py``; off with
    ``request_semantics``). HiCache copies the program held are released first."""
    if tokenizer_paused(ctx):
        ctx.continue_generation()
    if hicache_state.controller(ctx.scheduler) is not None:
        # held copies are the program's own window; the end needs them done
        # (a held load also keeps later loads of a full ack ring waiting)
        ctx.release_hicache_transfers()
    lost = [h for h in reqs if h.status == "lost"]
    if lost:
        raise EndStateError(f"requests lost: {', '.join(h.rid for h in lost)} held nowhere in the scheduler, "
                            f"yet never finished or aborted; state: {ctx.describe()}")
    slots = _slots(ctx)
    budget = END_FINISH_STEPS * slots
    for _ in range(budget):
        if not live(reqs):
            break
        yield
    stuck = live(reqs)
    if stuck:
        raise EndStateError(
            f"requests never finished: {len(stuck)} of {len(reqs)} still live after {budget} iterations "
            f"([{', '.join(h.rid + ':' + h.status for h in stuck)}]); state: {ctx.describe()}")
    budget = END_IDLE_STEPS * slots
    for _ in range(budget):
        if ctx.is_fully_idle and ctx.nothing_held:
            break
        yield
    if not (ctx.is_fully_idle and ctx.nothing_held):
        raise EndStateError(f"engine not idle: every request finished but after {budget} iterations "
                            f"is_fully_idle={ctx.is_fully_idle} nothing_held={ctx.nothing_held}; "
                            f"state: {ctx.describe()}")
    stats = ctx.engine_stats()
    held_by_script = ctx.exhausted_kv_tokens
    problems = []
    if stats["req_pool_free"] != stats["req_pool_total"]:
        problems.append(f"req_to_token rows free {stats['req_pool_free']}/{stats['req_pool_total']}")
    if stats["kv_pool_free"] + stats["evictable"] + held_by_script != stats["kv_pool_total"]:
        problems.append(f"KV free {stats['kv_pool_free']} + evictable {stats['evictable']} != "
                        f"total {stats['kv_pool_total']}")
    if stats["protected"]:
        problems.append(f"{stats['protected']} tree tokens still protected (locked)")
    if problems:
        raise EndStateError("pools not whole at idle: " + "; ".join(problems))
    compared = 0
    if ctx.check_enabled("greedy_output"):
        compared = yield from output_oracle.check_outputs(ctx, reqs)
    answers = 0
    if ctx.check_enabled(request_contract.NAME):  # last: the checks above keep their findings' names
        answers = request_contract.check_answers(reqs)
    return {
        "outputs_compared": compared,
        "answers_checked": answers,
        "requests": len(reqs),
        "finished": sum(1 for h in reqs if h.status == "finished"),
        "aborted": sum(1 for h in reqs if h.status == "aborted"),
        "tree_tokens": stats["tree_tokens"],
        "slot": state.pp_slot(ctx.scheduler),
    }


# An explored hold ends by itself: a slow GPU copy still finishes, and a
# program that waits for idle (a flush, a weight update) must see it end.
HOLD_ITERATIONS = 16


def hold_transfers(ctx, *, loads: bool, backups: bool) -> None:
    """Hold HiCache's loads and/or backups (``ctx.hold_hicache_transfers``)
    for at most ``HOLD_ITERATIONS`` each; counted in the coverage table as
    ``hicache:hold``."""
    if coverage_sink is not None:
        coverage_sink("hicache:hold")
    ctx.hold_hicache_transfers(loads=loads, backups=backups, max_iterations=HOLD_ITERATIONS)


def release_transfers(ctx) -> int:
    """Release what the HiCache gate holds; counted as ``hicache:release``."""
    if coverage_sink is not None:
        coverage_sink("hicache:release")
    return ctx.release_hicache_transfers()


# Set by the interpreter for the program it runs: records a coverage-table row and its phases.
coverage_sink: Optional[Any] = None


def extension_action(ctx, reqs, name: str):
    """``yield from explore.extension_action(ctx, reqs, NAME)``: run the
    extension action NAME (``scripted_runtime/extensions.py``), loaded in
    this rank by ``--extension``; counted in the coverage table as
    ``ext:NAME`` in the phases it started in."""
    from scripted_runtime import extensions

    ext = extensions.get_action(name)
    if coverage_sink is not None:
        coverage_sink(f"ext:{name}")
    result = ext.fn(ctx, reqs)
    if inspect.isgenerator(result):
        result = yield from result
    return result
