"""PR 10071: pause_generation(in_place | retract) followed by flush_cache.

* ``in_place`` leaves batch state alone (window ``paused_in_place_busy``): a
  flush during the pause must be refused, and generation resumes intact after
  ``continue_generation``. All releases with the mode behave so.
* ``retract`` moves live requests back to the waiting queue (window
  ``paused_retract_waiting_with_kv``); their KV stays in the radix tree. A
  flush there was refused until 0.5.21 and is accepted since (the idle gate
  ignores waiting requests that hold no row); the requests recompute their
  KV after ``continue_generation`` and still finish with all their tokens.

* ``arriving``: a request posted in the same batch as the pause and the
  flush. SGLang queues the request, pauses, then processes the flush with
  only that request held (waiting, no KV): accepted since 0.5.21 on every
  loop, PP included (the driver rank's gate adds its micro-batch slots,
  all empty then). After ``continue_generation`` the request finishes
  intact.

The PP loop of 0.5.23 ignores the pause (see README), so run ``in_place``
and ``retract`` at pp=1; ``arriving`` runs on every topology, at pp=4 with
the ``pause`` check off (``--skip-invariant pause``: the registered
``pp_pause_ignored`` admits the request while paused).

Run: ``scripted-runtime run scenarios/pause_then_flush.py:in_place`` (or ``:retract``, ``:arriving``)
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


def arriving(ctx):
    """A request, the pause and a flush in one batch: the flush is accepted
    and the request finishes intact after continue (module docstring)."""
    req = ctx.start_req(prompt_len=16, max_new_tokens=8, ignore_eos=True)
    ctx.pause_generation("in_place")
    flush = ctx.flush_cache()  # posted with the request and the pause: one batch
    yield from flush.wait()
    ctx.continue_generation()
    yield from ctx.wait_finished(req, max_steps=600)
    assert flush.success is True, f"flush refused with only a queued request during a pause: {flush}"
    assert len(req.output_ids) == 8, f"the queued request did not finish intact: {req.output_ids}"
    return {"flush_success": flush.success, "output_len": len(req.output_ids)}
