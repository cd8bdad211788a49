"""The statistics and tables every bench prints, in one place.

Cells are ``median (min..max)`` (``spread``), ``lo..hi`` (``min_max``) or
``median (q1..q3)`` (``quartiles``); ratios are taken pair by pair, within one
round or repeat (``ratios``), because this box's speed drifts over minutes; a
target is judged on the median (``meets``, ``verdict``); runs rotate their
order from round to round (``rotated``); every table is markdown
(``md_table``) under one line naming the date, commit, release and machine
(``machine_line``).
"""
from __future__ import annotations

import os
import platform
import statistics
import subprocess
import time
from pathlib import Path
from typing import Callable, List, Optional, Sequence, Tuple, TypeVar

ROOT = Path(__file__).resolve().parent.parent
T = TypeVar("T")


def spread(values: Sequence[float], fmt: str = "{:.2f}") -> str:
    """``median (min..max)``; a lone value stands alone; none is ``n/a``."""
    if not values:
        return "n/a"
    med = statistics.median(values)
    if len(values) == 1:
        return fmt.format(med)
    return f"{fmt.format(med)} ({fmt.format(min(values))}..{fmt.format(max(values))})"


def min_max(values: Sequence[float], fmt: str = "{:.0f}") -> str:
    """``min..max``, for a table that shows the median in a column of its own."""
    return f"{fmt.format(min(values))}..{fmt.format(max(values))}"


def quartiles(values: Sequence[float], fmt: str = "{:.3f}x") -> str:
    """``median (q1..q3)``; a lone value stands alone; none is ``n/a``."""
    if len(values) < 2:
        return fmt.format(values[0]) if values else "n/a"
    q1, med, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return f"{fmt.format(med)} ({fmt.format(q1)}..{fmt.format(q3)})"


def ratios(a: Sequence[float], b: Sequence[float]) -> List[float]:
    """``a[i] / b[i]`` pair by pair (one round or repeat each), skipping a zero ``b``."""
    return [x / y for x, y in zip(a, b) if y]


def meets(values: Sequence[float], op: str, bound: float) -> bool:
    """Whether the median of ``values`` is ``<=`` or ``>=`` (``op``) ``bound``."""
    med = statistics.median(values)
    return med <= bound if op == "<=" else med >= bound


def verdict(checks: Sequence[Tuple[str, Sequence[float], str, float]]) -> str:
    """'met' / '**NOT met**' for targets judged on median values: each check
    is (what, values, '<=' or '>=', bound). A check with no values is named,
    the others still judge."""
    if not checks:
        return ""
    failed, missing = [], []
    for what, values, op, bound in checks:
        if not values:
            missing.append(what)
        elif not meets(values, op, bound):
            failed.append(f"{what} {statistics.median(values):.2f}")
    if len(missing) == len(checks):
        return "n/a (no " + ", ".join(missing) + ")"
    said = "**NOT met**: " + ", ".join(failed) if failed else "met"
    return said + (f" (no figure {', '.join(missing)})" if missing else "")


def rotated(items: Sequence[T], turn: int) -> List[T]:
    """``items`` rotated left by ``turn``: the order of round ``turn``, so each
    item goes first in turn and none always follows the same one first."""
    if not items:
        return []
    k = turn % len(items)
    return list(items[k:]) + list(items[:k])


def wall_times(run: Callable[[], object], n: int) -> List[float]:
    """The wall time of each of ``n`` calls of ``run``."""
    samples = []
    for _ in range(n):
        t = time.monotonic()
        run()
        samples.append(time.monotonic() - t)
    return samples


def md_row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def md_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A markdown table: the header, its rule, one line per row."""
    return "\n".join([md_row(header), "|" + "---|" * len(header)] + [md_row(r) for r in rows])


def git_commit() -> str:
    """The checkout's short commit, ``+dirty`` when tracked files differ from it."""
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                             text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--"], cwd=ROOT, capture_output=True,
                               timeout=10).returncode != 0
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return sha + ("+dirty" if dirty else "")


def machine_line(sglang_version: Optional[str] = None) -> str:
    """Date, commit, SGLang release and machine: the line above every table."""
    if sglang_version is None:
        from scripted_runtime.hooks import sglang_compat

        sglang_version = sglang_compat.installed_sglang_version()
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (f"{time.strftime('%Y-%m-%d')}, commit {git_commit()}, sglang {sglang_version}, "
            f"{os.cpu_count()} cores ({platform.machine()}, {mem_gib:.0f} GiB)")
