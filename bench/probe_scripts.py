"""Harness-only probe scripts for bench/decode_gap.py and bench/invariants.py
(run inside the scheduler process, like any script; they reach into the
driver on purpose).
"""
from __future__ import annotations

import time

from scripted_runtime.hooks import scheduler_hook


def http_url(ctx):
    """The server's own HTTP base URL (where a plain client would post)."""
    return scheduler_hook.installed_driver(ctx.scheduler).poster.base_url
    yield  # noqa: unreachable - makes this a generator, as every script must be


def free_run(ctx, seconds: float):
    """Let the scheduler run its own loop for ``seconds``: the driver is
    skipped at every iteration (only the hooks' thin wrappers stay), so a
    request posted over HTTP meanwhile is served as by a server without a
    script. Then the driver is put back and the script ends."""
    d = scheduler_hook.installed_driver(ctx.scheduler)
    stepped, recorded = d.before_iteration, d.on_run_batch
    end = time.monotonic() + seconds

    def skip_driver() -> None:
        if time.monotonic() >= end:
            d.before_iteration, d.on_run_batch = stepped, recorded
            stepped()

    d.before_iteration = skip_driver
    d.on_run_batch = lambda batch: None
    yield


def python_gc(ctx, enabled: bool):
    """Switch Python's cyclic garbage collector on or off in the scheduler
    process (bench/invariants.py's ``default-gc-off``: is the collection the
    per-step allocations bring on part of the cost?). Returns the state it
    found."""
    import gc

    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    return was
    yield  # noqa: unreachable - makes this a generator, as every script must be


# --- per-piece timers (bench/iteration_cost.py) -----------------------------

_TIMERS_ATTR = "_bench_piece_timers"


def install_piece_timers(ctx):
    """Wrap the driver's per-iteration pieces (the driver, the step
    observer, the state scan, each check, the trace snapshot, the trace
    line) in ``perf_counter_ns`` accumulators that stay for the scripts run
    after this one, until ``take_piece_timers``. Returns nothing."""
    import time as _time

    from scripted_runtime.hooks import sglang_compat
    from scripted_runtime.scheduler_side import invariants, state, step_observer, trace_record
    from scripted_runtime.scheduler_side.context import radix

    d = scheduler_hook.installed_driver(ctx.scheduler)
    obs = d.observer
    totals: dict = {}
    undo = []
    clock = _time.perf_counter_ns

    def timed(name, fn):
        entry = totals.setdefault(name, [0, 0])

        def wrapper(*args, **kwargs):
            t0 = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                entry[0] += clock() - t0
                entry[1] += 1
        return wrapper

    def patch(obj, attr, name):
        original = obj.__dict__[attr] if attr in obj.__dict__ else None
        setattr(obj, attr, timed(name, getattr(obj, attr)))
        undo.append((obj, attr, original))

    patch(d, "before_iteration", "driver: before_iteration (all)")
    patch(d, "on_run_batch", "driver: on_run_batch (batch record)")
    patch(obs, "observe_windows", "observer: observe_windows")
    patch(obs, "after_script", "observer: after_script (all)")
    patch(step_observer, "StateView", "after_script: StateView (scan)")
    patch(trace_record, "snapshot", "after_script: trace snapshot")
    patch(trace_record, "encode_line", "after_script: trace encode")
    # inside the pieces above (each counted in its parent too)
    patch(trace_record.TraceWriter, "append", "after_script: trace append (encode + write)")
    patch(invariants.FreeRowsCache, "update", "slot_ownership: free-row set")
    patch(invariants.InvariantMemory, "free_kv_counts", "slot_ownership: free-KV counts")
    patch(invariants, "_check_kv_not_free", "slot_ownership: live rows vs free KV")
    patch(sglang_compat, "uncached_tokens", "pool_accounting: uncached tokens")
    patch(state, "pool_stats", "scan: pool stats")
    patch(radix, "all_lock_refs", "scan: tree lock refs (walk)")
    checker = obs.invariants
    runs_of = type(checker)._runs

    def label(run):  # the contract modules each name their entry point ``check``: say whose
        name = getattr(run, "__name__", "?")
        return f"check: {run.__module__.rsplit('.', 1)[-1]}.{name}" if name == "check" else f"check: {name}"

    def timed_runs(self=checker):
        return [timed(label(run), run) for run in runs_of(self)]

    checker._runs = timed_runs
    undo.append((checker, "_runs", None))
    setattr(d, _TIMERS_ATTR, (totals, undo))
    return None
    yield  # noqa: unreachable - makes this a generator, as every script must be


def take_piece_timers(ctx):
    """Remove ``install_piece_timers``' wrappers; returns name -> (total ns,
    calls) since they were installed."""
    d = scheduler_hook.installed_driver(ctx.scheduler)
    totals, undo = getattr(d, _TIMERS_ATTR)
    for obj, attr, original in reversed(undo):
        if original is None:
            try:
                delattr(obj, attr)
            except AttributeError:
                pass
        else:
            setattr(obj, attr, original)
    delattr(d, _TIMERS_ATTR)
    return {k: tuple(v) for k, v in totals.items()}
    yield  # noqa: unreachable



# --- cold against warm (bench/cold_warm.py) -----------------------------------

_COLD_WARM_ATTR = "_bench_cold_warm"
COLD_WARM_PIECES = ("StateView (scan)", "check_slot_ownership", "check_pool_accounting", "check_radix_locks",
                    "trace snapshot")


def install_cold_warm(ctx, repeats: int = 2):
    """At every iteration of the scripts run after this one (until
    ``take_cold_warm``), just before the observer's after-script work, time
    the scan, three invariants and the trace snapshot on the scheduler's
    state as the forward left it (cold), then ``repeats`` times more right
    away on the same state (warm: the same code and data, now in cache);
    then the observer's real work. What the pieces change is the slot
    ownership check's memory (its caches of the free lists, a chunked
    request's row), and on an unchanged state they change nothing, so the
    real work sees what it would have. Returns nothing."""
    import time as _time

    from scripted_runtime.scheduler_side import invariants, trace_record

    d = scheduler_hook.installed_driver(ctx.scheduler)
    obs = d.observer
    s = ctx.scheduler
    original = obs.after_script
    rows = []
    clock = _time.perf_counter_ns

    def once(mem):
        t = [clock()]
        view = invariants.StateView(s, extra_held_tokens=0)
        t.append(clock())
        invariants.check_slot_ownership(view, mem)
        t.append(clock())
        invariants.check_pool_accounting(view, mem)
        t.append(clock())
        invariants.check_radix_locks(view, mem)
        t.append(clock())
        trace_record.snapshot(s, view)
        t.append(clock())
        return [b - a for a, b in zip(t, t[1:])]

    def after_script():
        if not obs._pending:
            return original()
        mem = obs.invariants.memory
        rows.append([once(mem) for _ in range(1 + repeats)])
        return original()

    obs.after_script = after_script
    setattr(d, _COLD_WARM_ATTR, rows)
    return None
    yield  # noqa: unreachable - makes this a generator, as every script must be


def take_cold_warm(ctx):
    """Remove ``install_cold_warm``'s wrapper; returns, per iteration, per
    pass (cold first), the ns of each of ``COLD_WARM_PIECES``."""
    d = scheduler_hook.installed_driver(ctx.scheduler)
    rows = getattr(d, _COLD_WARM_ATTR)
    del d.observer.after_script
    delattr(d, _COLD_WARM_ATTR)
    return rows
    yield  # noqa: unreachable

if __name__ == "__main__":
    print(__doc__)
