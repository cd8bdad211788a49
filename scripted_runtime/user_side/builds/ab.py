"""``scripted-runtime ab``: the same scenarios on two builds, one table.

Sides run one after the other (each starts its own server; two servers at
once would halve the CPU each gets and change the timings). The table has a
row per scenario and side: status, failure signature (the invariant name or
the exception line, cut to SIGNATURE_WIDTH characters: ``--json`` keeps it
whole), steps and time.
"""
from __future__ import annotations

from typing import List, Sequence

from scripted_runtime import specs
from scripted_runtime.user_side.builds.side import SideReport

SIGNATURE_WIDTH = 100


def cell(text: str, width: int = SIGNATURE_WIDTH) -> str:
    """``text`` cut to ``width`` characters, the cut marked with '...'."""
    return text if len(text) <= width else text[: width - 3] + "..."


def short_scenario(spec: str) -> str:
    """'/abs/scenarios/x.py:fn' -> 'x.py:fn' (module specs unchanged)."""
    try:
        return specs.parse(spec).short
    except specs.SpecError:
        return spec


def format_table(reports: Sequence[SideReport]) -> str:
    rows: List[List[str]] = [["scenario", "side", "sglang", "result", "signature", "steps", "time"]]
    scenarios: List[str] = []
    for r in reports:
        for o in r.outcomes:
            if o.scenario not in scenarios:
                scenarios.append(o.scenario)
    for scenario in scenarios:
        for r in reports:
            for o in r.outcomes:
                if o.scenario != scenario:
                    continue
                rows.append([short_scenario(scenario), r.side, r.sglang_version or "?", o.status,
                             cell(o.signature) or "-", str(o.steps) if o.steps else "-",
                             f"{o.seconds:.1f}s" if o.seconds else "-"])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [" | ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    starts = [f"{r.side}: server start {r.start_s:.0f}s, side {r.wall_s:.0f}s in all"
              for r in reports if r.start_s is not None]
    return "\n".join(lines + ([""] + starts if starts else []))


def differs(reports: Sequence[SideReport]) -> bool:
    """True when some scenario's status differs between the sides."""
    by_scenario = {}
    for r in reports:
        for o in r.outcomes:
            by_scenario.setdefault(o.scenario, set()).add(o.status)
    return any(len(statuses) > 1 for statuses in by_scenario.values())
