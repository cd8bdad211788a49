"""PR 10071: pause_generation(in_place | retract) followed by flush_cache.

* ``in_place`` leaves batch state alone (window ``paused_in_place_busy``): a
  flush during the pause must be refused, and generation resumes intact after
  ``continue_generation``. All releases with the mode behave so.
* ``retract`` moves live requests back to the waiting queue (window
  ``paused_retract_waiting_with_kv``); their KV stays in the radix tree. A
  flush there was refused until 0.5.21 and is accepted since (the idle gate
  ignores waiting requests that hold no row); the requests recompute their
  KV after ``continue_generation`` and still finish with all their tokens.

The PP loop of 0.5.23 ignores the pause (see README), so run these at pp=1.

Run: ``scripted-runtime run scenarios/pause_then_flush.py:in_place`` (or ``:retract``)
"""
from __future__ import annotations

from scenarios import windows  # the harness puts the repository root on sys.path


def in_place(ctx):
    out = yield from windows.paused_in_place_busy(ctx)
    assert out["flush_success"] is False, f"flush accepted during an in_place pause: {out}"
    assert out["output_len"] == 40, out
    return out


def retract(ctx):
    out = yield from windows.paused_retract_waiting_with_kv(ctx)
    assert out["output_len"] == 40, f"the retracted request did not finish intact: {out}"
    return out
