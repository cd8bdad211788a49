"""``ctx.wait_until`` (``scheduler_side/context/waits.py``): the steps it
counts and the timeout that names what it waited for. No SGLang process."""
from __future__ import annotations

import pytest

from scripted_runtime.scheduler_side.context.waits import WaitTimeout, wait_until


def test_wait_until_counts_steps_and_names_what_it_waited_for():
    box = {"n": 0}

    def pred():
        box["n"] += 1
        return box["n"] >= 3

    gen = wait_until(pred, max_steps=10, what="x")
    steps = 0
    with pytest.raises(StopIteration) as stop:
        while True:
            next(gen)
            steps += 1
    assert stop.value.value == 2 and steps == 2
    gen = wait_until(lambda: False, max_steps=2, what="the thing", describe=lambda: "STATE")
    with pytest.raises(WaitTimeout, match="waited 2 steps for the thing; state seen: STATE"):
        for _ in range(5):
            next(gen)
