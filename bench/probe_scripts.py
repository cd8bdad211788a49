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


if __name__ == "__main__":
    print(__doc__)
