"""Replaying a program twice on one build must give the same step trace.

Two traces are compared after normalizing what legitimately differs between
runs: request ids (named by first appearance), ``req_to_token`` rows
(numbered by first appearance: the free list's order depends on history),
the global iteration counter, and PP slots (counted from the script's first
step). Anything else that differs is reported with the first step where it
does: either a harness bug or real nondeterminism in the build.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

RID = re.compile(r"\b[rR]\d+-\d+-\d+\b")
SLOT_LABEL = re.compile(r"\b(mbs|last_mbs|running_mbs)\[(\d+)\]")
DROPPED_KEYS = ("it", "iteration")  # the global iteration counter


class _Normalizer:
    def __init__(self, slots: int, first_slot: Optional[int]) -> None:
        self.slots = max(1, slots)
        self.first_slot = first_slot or 0
        self.rids: Dict[str, str] = {}
        self.rows: Dict[int, int] = {}

    def rid(self, m: "re.Match") -> str:
        return self.rids.setdefault(m.group(0), f"q{len(self.rids)}")

    def slot(self, value: int) -> int:
        return (value - self.first_slot) % self.slots

    def text(self, s: str) -> str:
        s = RID.sub(self.rid, s)
        return SLOT_LABEL.sub(lambda m: f"{m.group(1)}[{self.slot(int(m.group(2)))}]", s)

    def value(self, obj: Any, key: str = "") -> Any:
        if isinstance(obj, dict):
            out = {}
            for k, v in obj.items():
                if k in DROPPED_KEYS:
                    continue
                nk = self.text(k) if isinstance(k, str) else k
                if key == "rows" and isinstance(v, int):
                    out[nk] = self.rows.setdefault(v, len(self.rows))
                elif k == "slot" and isinstance(v, int):
                    out[nk] = self.slot(v)
                else:
                    out[nk] = self.value(v, k)
            return out
        if isinstance(obj, list):
            return [self.value(v, key) for v in obj]
        if isinstance(obj, str):
            return self.text(obj)
        return obj


def normalize(records: List[Dict[str, Any]], *, slots: int = 1) -> List[Dict[str, Any]]:
    first = next((r.get("slot") for r in records if isinstance(r.get("slot"), int)), None)
    norm = _Normalizer(slots, first)
    return [norm.value(r) for r in records]


# What the script injected after a step (the rest of a record is scheduler state).
INPUT_FIELDS = ("ops", "started")


@dataclass
class Difference:
    step: Optional[int]
    fields: List[str]
    first: Any
    second: Any

    @property
    def culprit(self) -> str:
        """``harness``: with identical scheduler state the program injected
        different operations or requests (the program and its helpers must be
        deterministic: a harness bug). ``build``: the same inputs so far, but
        the scheduler's state differs."""
        if self.step is None:
            return "build"
        return "harness" if set(self.fields) <= set(INPUT_FIELDS) else "build"

    def describe(self) -> str:
        if self.step is None:
            return f"the traces have different lengths ({self.first} vs {self.second} steps)"
        detail = "; ".join(f"{f}: {self.first.get(f)!r} vs {self.second.get(f)!r}" for f in self.fields[:4])
        if self.culprit == "harness":
            return (f"step {self.step}: the scheduler state was the same but the program injected different "
                    f"inputs ({detail}): the harness is nondeterministic here (a harness bug)")
        return (f"step {self.step}: the same operations and requests were injected up to here but the scheduler "
                f"state differs in {', '.join(self.fields)} ({detail}): nondeterminism in this SGLang build "
                "(or in how the harness delivered those inputs; compare the traces)")


def compare(a: List[Dict[str, Any]], b: List[Dict[str, Any]], *, slots: int = 1) -> Optional[Difference]:
    """None when the normalized traces agree, else the first difference."""
    na, nb = normalize(a, slots=slots), normalize(b, slots=slots)
    for ra, rb in zip(na, nb):
        if ra != rb:
            fields = sorted(k for k in set(ra) | set(rb) if ra.get(k) != rb.get(k))
            return Difference(ra.get("step"), fields, ra, rb)
    if len(na) != len(nb):
        return Difference(None, [], len(na), len(nb))
    return None


def pp_loop_slots(topology_kwargs: Dict[str, Any]) -> int:
    pp = int(topology_kwargs.get("pp_size", 1) or 1)
    return pp + int(topology_kwargs.get("pp_async_batch_depth", 0) or 0) if pp > 1 else 1


def check_traces(first: Tuple[Optional[str], str], second: Tuple[Optional[str], str], *,
                 topology: str) -> Tuple[bool, str]:
    """Compare two runs of one program, each (failure signature or None, trace
    path); returns (same, one-line verdict)."""
    from scripted_runtime.user_side.engine_config import ALL_TOPOLOGIES
    from scripted_runtime import timeline

    traces = []
    for i, (_, path) in enumerate((first, second), 1):
        try:
            traces.append(timeline.load(str(path))[1])
        except (OSError, ValueError) as exc:
            return False, f"run {i} left no readable trace ({exc})"
    where = f"(traces {first[1]} and {second[1]})"
    if first[0] != second[0]:
        return False, (f"NONDETERMINISTIC: the same program ended differently: {first[0] or 'PASS'} vs "
                       f"{second[0] or 'PASS'} {where}")
    diff = compare(traces[0], traces[1], slots=pp_loop_slots(ALL_TOPOLOGIES[topology]))
    if diff is not None:
        return False, f"NONDETERMINISTIC: {diff.describe()} {where}"
    return True, f"deterministic: two runs gave the same {len(traces[0])}-step trace ({first[0] or 'PASS'})"


def check(runner, program, *, trace_dir, label: str = "program") -> Tuple[bool, str]:
    """Run ``program`` twice with step traces and compare them."""
    from pathlib import Path

    trace_dir = Path(trace_dir)
    trace_dir.mkdir(parents=True, exist_ok=True)
    runs = []
    for i in (1, 2):
        path = trace_dir / f"determinism-{label}-{i}.jsonl"
        runs.append((runner.run(program, trace=path).signature, str(path)))
    return check_traces(runs[0], runs[1], topology=runner.topology)
