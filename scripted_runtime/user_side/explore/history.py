"""A failure that needs its server's history: replay it on a fresh server,
shrink it, or call the failure nondeterministic (harness process).

A failing program whose written file passes on a fresh server may need what
ran before it on the server that met it: state the engine reset does not
clear. ``recover`` replays that history (the programs the server ran before
the failure was first met, in order, each after the engine reset and
followed by the settle probe, as in the search) and then the failing
program, on a fresh server. If the failure comes back, ``ddmin`` drops the
earlier programs it does not need, then the failing program's actions, each
trial on a fresh server; the result is written as one scenario file that
runs the needed programs in order (``writer.write_history_scenario``,
``RUNS_BEFORE``). If even the whole history does not bring it back, the
verdict is "nondeterministic", with the traces of both runs kept.

Where the file that did not replay was Hypothesis's shrink (made on the
explorer's server, after the programs and shrink trials before it), the
program as first met is run alone on a fresh server first: if it fails
there, the failure needs no history, only that shrink did, and ``ddmin``
shrinks the program again on fresh servers.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from scripted_runtime import specs


def ddmin(items: Sequence[Any], fails: Callable[[List[Any]], bool], *, deadline: float = float("inf"),
          clock: Callable[[], float] = time.monotonic) -> List[Any]:
    """Zeller's delta debugging: a 1-minimal sublist of ``items`` (order
    kept) on which ``fails`` still holds, assuming it holds on ``items``.
    The empty list is tried first. At ``deadline`` it returns the smallest
    failing sublist found so far. ``fails`` is asked at most once per
    distinct sublist."""
    seen: Dict[Tuple[int, ...], bool] = {}
    index = list(range(len(items)))

    def test(ix: List[int]) -> bool:
        key = tuple(ix)
        if key not in seen:
            seen[key] = fails([items[i] for i in ix])
        return seen[key]

    if not index or test([]):
        return []
    n = 2
    while len(index) >= 2 and clock() < deadline:
        chunk = -(-len(index) // n)
        subsets = [index[i:i + chunk] for i in range(0, len(index), chunk)]
        reduced = False
        for sub in subsets:
            if clock() >= deadline:
                break
            if test(sub):
                index, n, reduced = sub, 2, True
                break
        if not reduced and len(subsets) > 2:
            for sub in subsets:
                if clock() >= deadline:
                    break
                rest = [i for i in index if i not in sub]
                if test(rest):
                    index, n, reduced = rest, max(n - 1, 2), True
                    break
        if not reduced:
            if n >= len(index):
                break
            n = min(len(index), 2 * n)
    return [items[i] for i in index]


def _key(history: Sequence[Any], final: Sequence[Any]) -> Tuple:
    return tuple(e if isinstance(e, str) else tuple(e) for e in history), tuple(final)


@dataclass
class Recovery:
    """What ``recover`` found. ``reproduced``: the failure came back after
    the history on a fresh server; then ``earlier`` (the programs it needs,
    in order) and ``program`` (the failing one, shrunk) are set."""

    reproduced: bool
    earlier: List[Any] = field(default_factory=list)
    program: List[Any] = field(default_factory=list)
    history_len: int = 0
    trials: int = 0  # fresh servers used
    seconds: float = 0.0
    shrink_complete: bool = True  # False: the budget ran out before ddmin ended
    # the program as first met fails alone on a fresh server: only its shrink on the used server did not
    alone: bool = False
    outcome: Any = None  # the failing run of ``program`` after ``earlier`` (where it failed)
    traces: Dict[str, str] = field(default_factory=dict)  # what each kept trace shows -> path
    verdict: str = ""


def recover(runner: Any, *, earlier: Sequence[Any], program: Sequence[Any], shrunk: Optional[Sequence[Any]],
            signature: str, budget_s: float, trace_dir: Path,
            progress: Callable[[str], None] = lambda line: None) -> Recovery:
    """Replay ``earlier`` (the history before the failure was first met)
    then ``program`` (the failing program as first met) on a fresh server;
    if ``signature`` comes back, shrink: the history first, then the
    program (``shrunk``, Hypothesis's shrunk form, is tried before the
    action-by-action ddmin). ``budget_s`` bounds the shrinking (the first
    replay always runs). ``runner`` must own its server."""
    t0 = time.monotonic()
    out = Recovery(reproduced=False, history_len=len(earlier))
    trace_dir.mkdir(parents=True, exist_ok=True)

    failing: Dict[Tuple, Any] = {}  # (earlier, program) -> the failing outcome of that trial

    def trial(history: Sequence[Any], final: Sequence[Any], trace: Any = False) -> bool:
        out.trials += 1
        progress(f"history trial {out.trials}: {len(history)} earlier programs, then {len(final)} actions, "
                 "on a fresh server")
        runner.fresh_server("a fresh server for the trial")
        for entry in history:
            if isinstance(entry, str):
                script = specs.parse(entry, what="script")
                runner.run_file(script.where, function=script.attr)
            else:
                runner.run(list(entry))
        got = runner.run(list(final), trace=trace)
        if got.signature == signature:
            failing[_key(history, final)] = got
            return True
        return False

    deadline = t0 + budget_s
    # The file that did not replay alone was Hypothesis's shrink, made on the explorer's server: the
    # program as first met may still fail alone on a fresh server (the shrink leaned on that server's
    # state, not the failure). Then no history is needed, and the program is shrunk again here.
    reshrink = shrunk is not None and list(shrunk) != list(program)
    needed: List[Any] = []
    if reshrink:
        progress(f"the shrunk file ({len(shrunk)} actions) did not reproduce alone on a fresh server: running the "
                 f"program as first met ({len(program)} actions) alone on a fresh server")
        alone_trace = trace_dir / "first-program-alone.jsonl"
        out.alone = trial([], program, trace=alone_trace)
        out.traces[f"the program as first met, alone on a fresh server "
                   f"({'it failed' if out.alone else 'it passed'})"] = str(alone_trace)
    if not out.alone:
        progress(f"the failure did not reproduce alone on a fresh server: replaying the {len(earlier)} programs "
                 "its server ran before it, then it, on a fresh server")
        full_trace = trace_dir / "history-replay.jsonl"
        if not trial(earlier, program, trace=full_trace):
            out.seconds = time.monotonic() - t0
            out.traces["the failing program after its whole history, on a fresh server (it passed)"] = str(full_trace)
            out.verdict = (f"NONDETERMINISTIC: {signature} came back neither alone nor after the {len(earlier)} "
                           f"programs its server ran before it, on a fresh server ({out.trials} fresh servers)")
            return out
        out.traces["the failing program after its whole history, on a fresh server (it failed)"] = str(full_trace)
        progress(f"the failure came back after its history: shrinking the {len(earlier)} earlier programs "
                 f"(each trial a fresh server; up to {budget_s:.0f}s)")
        # Alone on a fresh server the program passed already (the caller's replay, or the trial above).
        needed = ddmin(list(earlier), lambda sub: bool(sub) and trial(sub, program), deadline=deadline)
    out.reproduced = True
    final = list(program)
    # Hypothesis's shrink is known to pass alone; after a history it may fail
    if reshrink and needed and time.monotonic() < deadline and trial(needed, shrunk):
        final = list(shrunk)
    if time.monotonic() < deadline and final:
        final = ddmin(final, lambda acts: trial(needed, acts), deadline=deadline)
    out.shrink_complete = time.monotonic() < deadline
    out.earlier, out.program = needed, final
    out.outcome = failing.get(_key(needed, final))
    out.seconds = time.monotonic() - t0
    spent = f"{out.seconds:.0f}s{'' if out.shrink_complete else ', budget spent before the shrink ended'}"
    if out.alone:
        out.verdict = (f"needs no history: {signature} comes back alone on a fresh server with the program as "
                       f"first met ({len(program)} actions); its shrink on the explorer's server "
                       f"({len(shrunk)} actions) does not, so that shrink leaned on the server's state; shrunk "
                       f"again on fresh servers to {len(final)} actions ({out.trials} fresh servers, {spent})")
    else:
        out.verdict = (f"needs history: {signature} comes back on a fresh server only after {len(needed)} of the "
                       f"{len(earlier)} programs its server ran before it (shrunk in {out.trials} fresh servers, "
                       f"{spent})")
    progress(out.verdict)
    return out
