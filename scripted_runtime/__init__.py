"""Deterministic scripted-runtime harness for the SGLang scheduler.

The package is split by the process its code runs in:

* ``scheduler_side/``: runs inside SGLang's scheduler process, on the driver
  rank, while the event loop is frozen between iterations (driver, step
  observer, tokenizer inbox, state views, windows, invariants, the script
  context, control operations, trace recording, the explorer's program
  helpers). It never imports ``user_side``.
* ``user_side/``: runs in the user's process (``ScriptedServer``, launch,
  process control, builds, explore, the CLI, trace rendering). It may read
  the scheduler side's catalogs (invariant and window names), never run it.
* shared, at the top: ``protocol`` (the messages and environment variables
  that cross between the two), ``errors`` and ``timeline`` (the one-line-per-
  step format both sides print).

``docs/internals.md`` draws the two sides. Public names are imported lazily,
so importing this package inside the scheduler costs nothing.
"""
__all__ = ["ScriptedServer", "ScriptResult", "ScriptFailedError"]


def __getattr__(name):
    if name == "ScriptedServer":
        from scripted_runtime.user_side.server import ScriptedServer

        return ScriptedServer
    if name in ("ScriptResult", "ScriptFailedError"):
        from scripted_runtime.user_side import result

        return getattr(result, name)
    raise AttributeError(f"module 'scripted_runtime' has no attribute {name!r}")
