"""Fix toggles: undo a named SGLang fix in-process, so a scenario can be shown
to catch its bug on a release that carries the fix (fast A/B in CI).

The harness sets ``SCRIPTED_RUNTIME_REVERT_FIXES=name[,name]`` for a server
(``ScriptedServer.start(revert_fixes=[...])``, ``--revert-fix NAME``); when
the scheduler module is imported in each rank, every named toggle patches the
fixed code back to its buggy form. A toggle that does not apply to the
installed release fails the server start with a message saying so.

Each toggle names the fix, the releases that carry it, and what the buggy
form was (read off the PR).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Dict, List

ENV_REVERT_FIXES = "SCRIPTED_RUNTIME_REVERT_FIXES"


class FixToggleError(RuntimeError):
    pass


@dataclass(frozen=True)
class FixToggle:
    name: str
    fixed_in: str
    summary: str
    install: Callable[[Any], None]  # receives the imported scheduler module


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


TOGGLES: Dict[str, FixToggle] = {
    t.name: t
    for t in (
        FixToggle("pr27446", "0.5.13",
                  "PP is_fully_idle ignores in-flight microbatches in mbs (flush during an in-flight chunk)",
                  _revert_pr27446),
    )
}


def validate(names: List[str]) -> List[str]:
    unknown = [n for n in names if n not in TOGGLES]
    if unknown:
        raise ValueError(f"unknown fix toggle(s) {unknown}; known: "
                         + ", ".join(f"{t.name} ({t.summary})" for t in TOGGLES.values()))
    return list(names)


def requested() -> List[str]:
    return [n for n in os.environ.get(ENV_REVERT_FIXES, "").split(",") if n]


def install_requested(scheduler_module: Any) -> None:
    for name in validate(requested()):
        TOGGLES[name].install(scheduler_module)
