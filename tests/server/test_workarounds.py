"""The PP profiler fence (hooks/workarounds.py, ``fence_pp_profiler_stop``)
on a real pp4 server: the profiler stress scenario that the registered
``pp_profiler_stop_with_sends_in_flight`` crashes (its strict xfail, with
the checks off, is in tests/server/test_known_bugs.py) passes with every
check on once the fence waits the loop's sends before each stop. Slow lane:
a pp4 server of its own and 60 profiled rounds (about 40 s). The rules of
when an exploration adds it: tests/logic/test_workarounds.py."""
from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.scripted_runtime(pp=4, patches=("fence_pp_profiler_stop",))
def test_profiled_rounds_under_pp_pass_with_the_fence(scripted_server):
    result = scripted_server.run(f"{ROOT}/scenarios/profiler_stress.py:with_profiles")
    assert result.passed, result.summary()
    assert scripted_server.alive
