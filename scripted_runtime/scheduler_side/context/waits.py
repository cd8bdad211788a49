"""Bounded waits for scripts: ``yield from wait_until(...)``.

Every wait has a step budget; running out raises ``WaitTimeout`` naming what
was awaited and the scheduler state seen at the end.
"""
from __future__ import annotations

from typing import Callable, Generator, Optional


class WaitTimeout(AssertionError):
    """A script waited longer than its step budget for a condition."""


def wait_until(
    predicate: Callable[[], bool],
    *,
    max_steps: int,
    what: str,
    describe: Optional[Callable[[], str]] = None,
) -> Generator[None, None, int]:
    """Yield (one scheduler iteration each) until ``predicate()`` holds.

    Returns the number of steps waited (0 if it already held)."""
    for waited in range(max_steps + 1):
        if predicate():
            return waited
        if waited == max_steps:
            break
        yield
    state = describe() if describe is not None else "(no state description)"
    raise WaitTimeout(f"waited {max_steps} steps for {what}; state seen: {state}")
