"""Runs an explored program's source in the scheduler process.

``run_source(ctx, source)`` compiles the program (the same text a failure is
written out as), counts which scheduler phase each control operation lands
in, and returns the end-state summary plus that coverage as the script's
value. Around the program it loads the served weights back when a weight
update changed them (``output_oracle.restore_served_weights``).
"""
from __future__ import annotations

import linecache
from typing import Any, Dict

from scripted_runtime.scheduler_side import output_oracle
from scripted_runtime.scheduler_side.explore import phases
from scripted_runtime.scheduler_side.explore import program as program_helpers

PROGRAM_FILENAME = "<explored program>"
# The function an explored program's source defines (and a written scenario file holds).
PROGRAM_FUNCTION = "program"


def nothing(ctx):
    """A script that does nothing. The explorer runs it right after a program
    that passed: the engine reset before it then tells whether the program
    left an engine that a reset can restore (the next program pays no more
    for it: its own reset then finds a clean engine)."""
    return None
    yield  # a generator, as every script


def run_source(ctx, source: str):
    code = compile(source, PROGRAM_FILENAME, "exec")
    # Tracebacks then show the program's lines.
    linecache.cache[PROGRAM_FILENAME] = (len(source), None, source.splitlines(True), PROGRAM_FILENAME)
    namespace: Dict[str, Any] = {"__name__": "explored_program"}
    exec(code, namespace)
    coverage: Dict[str, int] = {}

    def on_control(op, payload) -> None:
        kind = phases.op_kind(op.name, payload)
        paused = program_helpers.tokenizer_paused(ctx, ctx.control_ops[:-1])  # before this op
        for phase in phases.phases_of(ctx.scheduler, tokenizer_paused=paused):
            key = f"{kind}|{phase}"
            coverage[key] = coverage.get(key, 0) + 1

    def on_extension(kind: str) -> None:
        if kind.startswith("fuzzcase:"):  # a fuzzed request's field case: counted once, not per phase
            coverage[kind] = coverage.get(kind, 0) + 1
            return
        paused = program_helpers.tokenizer_paused(ctx, ctx.control_ops)
        for phase in phases.phases_of(ctx.scheduler, tokenizer_paused=paused):
            key = f"{kind}|{phase}"
            coverage[key] = coverage.get(key, 0) + 1

    # A program that failed after a weight update left the update's weights: start from the
    # served ones (a no-op otherwise), as a replay on a fresh server does.
    yield from output_oracle.restore_served_weights(ctx)
    ctx.control_listeners.append(on_control)
    program_helpers.coverage_sink = on_extension
    try:
        summary = yield from namespace[PROGRAM_FUNCTION](ctx)
    finally:
        ctx.control_listeners.remove(on_control)
        program_helpers.coverage_sink = None
    yield from output_oracle.restore_served_weights(ctx)  # after its checks: the next program's start
    return {"end": summary, "coverage": coverage}
