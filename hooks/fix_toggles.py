"""Fix toggles: undo a named SGLang fix in-process, so a scenario can be shown
to catch its bug on a release that carries the fix (fast A/B in CI).

The harness sets ``SCRIPTED_RUNTIME_REVERT_FIXES=name[,name]`` for a server
(``ScriptedServer.start(revert_fixes=[...])``, ``--revert-fix NAME``); when
the scheduler module is imported in each rank, every named toggle patches the
fixed code back to its buggy form. A toggle that does not apply to the
installed release fails the server start with a message saying so.

Each toggle is declared on its revert function, ``@fix_toggle(name,
fixed_in=..., summary=...)``: the fix, the first release that carries it,
and the buggy form in one line; the function's docstring says what the buggy
form was (read off the PR). ``TOGGLES`` holds them in declaration order.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, List

from scripted_runtime import protocol
from scripted_runtime.hooks.patch_base import PatchError, declaring

ENV_REVERT_FIXES = protocol.ENV_REVERT_FIXES


class FixToggleError(PatchError):
    pass


@dataclass(frozen=True)
class FixToggle:
    name: str
    fixed_in: str
    summary: str
    install: Callable[[Any], None]  # receives the imported scheduler module


TOGGLES: Dict[str, FixToggle] = {}


def fix_toggle(name: str, *, fixed_in: str, summary: str) -> Callable:
    """Declare the decorated ``_revert_<name>(scheduler_module)`` as fix
    toggle ``name``: ``fixed_in`` is the first release carrying the fix,
    ``summary`` the buggy form in one line."""
    return declaring(TOGGLES, lambda install: FixToggle(name, fixed_in, summary, install))


@fix_toggle("pr27446", fixed_in="0.5.13",
            summary="PP is_fully_idle ignores in-flight microbatches in mbs (flush during an in-flight chunk)")
def _revert_pr27446(scheduler_module: Any) -> None:
    """PR 27446 made ``is_fully_idle`` see in-flight PP microbatches: 0.5.13+
    ``_pp_microbatches_drained`` checks ``running_mbs`` *and* every ``mbs``
    slot. The buggy form checked ``running_mbs`` only, so an extend batch in
    flight in ``mbs[i]`` (its last chunk dispatched, ``chunked_req`` None)
    looked idle and a flush reset the tree under it."""
    cls = scheduler_module.Scheduler
    if not hasattr(cls, "_pp_microbatches_drained"):
        raise FixToggleError(
            "fix toggle pr27446: Scheduler._pp_microbatches_drained not found; this release "
            "predates the fix (<=0.5.12.post1 carries the bug already) or restructured it")

    def _pp_microbatches_drained(self) -> bool:  # the pre-PR-27446 check
        running_mbs = getattr(self, "running_mbs", None)
        if not running_mbs:
            return True
        return all(x.is_empty() for x in running_mbs)

    cls._pp_microbatches_drained = _pp_microbatches_drained


@fix_toggle("pr17850", fixed_in="0.5.9",
            summary="a chunked request leaves its req_to_token row after every chunk and takes a new one "
                    "(the old row is free while the previous chunk's forward may still read it)")
def _revert_pr17850(scheduler_module: Any) -> None:
    """PR 17850 (0.5.9) made ``ReqToTokenPool.alloc(reqs)`` keep the row of a
    request that already holds one, so a chunked request keeps its
    ``req_to_token`` row from first chunk to release. Before it, the scheduler
    freed the chunked request's row after every chunk (in
    ``get_next_batch_to_run``, right after caching the chunk) and the next
    chunk allocated a row afresh: a different one, while the forward of the
    previous chunk could still read the old row, which the next batch could
    hand to another request.

    0.5.23 has no such free to put back, so the buggy form is re-created at the
    same point: after ``stash_chunked_request`` (0.5.2x's name for caching
    the chunk) the request moves to a fresh row (the prefix copied over, as
    the pre-fix prepare_for_extend rewrote it) and its old row goes back to
    the free list."""
    cls = scheduler_module.Scheduler
    if not hasattr(cls, "stash_chunked_request"):
        raise FixToggleError(
            "fix toggle pr17850: Scheduler.stash_chunked_request not found; the toggle is written "
            "against 0.5.2x (<=0.5.8.post1 carries the bug already)")
    original = cls.stash_chunked_request

    def stash_chunked_request(self, req: Any) -> None:
        original(self, req)
        pool = self.req_to_token_pool
        old = getattr(getattr(req, "kv", None), "req_pool_idx", None)
        if old is None or not hasattr(pool, "alloc_rows"):
            return
        fresh = pool.alloc_rows(1)
        if not fresh:  # no spare row: the pre-fix free+alloc would have handed the same one back
            return
        pool.req_to_token[fresh[0]] = pool.req_to_token[old]
        pool.free_rows([old])
        req.kv.req_pool_idx = fresh[0]

    stash_chunked_request.__wrapped__ = original
    cls.stash_chunked_request = stash_chunked_request


WEIGHT_UPDATER_MODULE = "sglang.srt.managers.scheduler_components.weight_updater"


@fix_toggle("issue14062", fixed_in="0.5.22",
            summary="update_weights with flush_cache asserts the flush (kills the scheduler) instead of "
                    "answering success=False when requests are still held")
def _revert_issue14062(scheduler_module: Any) -> None:
    """0.5.22 made an update_weights call whose flush_cache is refused (a
    finished request still in running_batch: issue 14062) answer
    success=False ("Weights were updated, but the cache was not flushed
    ..."). Up to 0.5.21 ``flush_cache_after_weight_update`` asserted the
    flush instead ("Cache flush failed after updating weights"), which killed
    the scheduler."""
    import importlib

    module = importlib.import_module(WEIGHT_UPDATER_MODULE)
    cls = getattr(module, "SchedulerWeightUpdaterManager", None)
    original = getattr(cls, "flush_cache_after_weight_update", None)
    if original is None or "message" not in original.__code__.co_varnames:
        raise FixToggleError(
            "fix toggle issue14062: SchedulerWeightUpdaterManager.flush_cache_after_weight_update(recv_req, "
            "success, message) not found; <=0.5.21 asserts the flush already")

    def flush_cache_after_weight_update(self, recv_req, success, message):  # the <=0.5.21 form
        if recv_req.flush_cache:
            flush_cache_success = self.flush_cache(empty_cache=recv_req.torch_empty_cache)
            assert flush_cache_success, "Cache flush failed after updating weights"
        return success, message

    flush_cache_after_weight_update.__wrapped__ = original
    cls.flush_cache_after_weight_update = flush_cache_after_weight_update


def validate(names: List[str]) -> List[str]:
    unknown = [n for n in names if n not in TOGGLES]
    if unknown:
        raise ValueError(f"unknown fix toggle(s) {unknown}; known: "
                         + ", ".join(f"{t.name} ({t.summary})" for t in TOGGLES.values()))
    return list(names)


def requested() -> List[str]:
    return protocol.listed(ENV_REVERT_FIXES)


def install_requested(scheduler_module: Any) -> None:
    for name in validate(requested()):
        TOGGLES[name].install(scheduler_module)
