"""Exploration statistics: counts, where the time went, windows reached,
the control-operation x scheduler-phase coverage table and the abstract
states reached over time. Plain data, so parallel workers can send theirs
as JSON and the parent can merge them."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Dict, Iterable, List, Optional

from scripted_runtime.scheduler_side.explore.phases import FEATURE_PHASES, PHASES
from scripted_runtime.user_side import engine_config

OPS = ("flush_cache", "update_weights(flush)", "update_weights(no_flush)", "update_weights(tensor)",
       "update_weights(distributed)", "update_weights(missing)", "pause(in_place)",
       "pause(retract)", "pause(abort)", "continue", "abort", "abort_all", "release(all)", "release(kv_cache)",
       "release(weights)", "resume(weights)", "resume(kv_cache)", "resume(all)", "set_internal_state", "slow_down",
       "check_weights(checksum)", "check_weights(snapshot)", "check_weights(compare)", "get_weights_by_name",
       "update_weight_version", "server_info", "freeze_gc", "open_session", "close_session", "configure_logging",
       "start_profile", "stop_profile")

# Phases with a request in the running batch (or finished there, not yet pruned, or in a PP slot:
# ``pp_in_flight`` holds only beside ``prefill_chunk`` or ``decode``).
BUSY_PHASES = ("prefill_chunk", "decode", "pp_in_flight", "finished_unpruned")


def can_occur(op: str, phase: str, topology: str, device: str = "cpu") -> bool:
    """Whether operation ``op`` can be processed against phase ``phase`` on
    ``topology`` at all, by SGLang's own preconditions (docs/exploring.md,
    "The statistics and the coverage table"): ``pp_in_flight`` needs a pipeline; a memory release needs
    the running batch (and every PP slot) empty (``release_memory_occupation`` asserts
    ``is_fully_idle``, waiting requests allowed while paused: a release
    against a busy engine kills the scheduler by design, so none is sent),
    and while memory is released nothing runs (the harness starts nothing,
    and SGLang released with only queued requests, paused), so a resume
    meets no running request either; ``check_weights(compare)`` needs
    SGLang's comparator, which runs on CUDA only (on CPU the explorer sends
    a checksum instead); under PP the trainer's broadcast
    (``update_weights(distributed)``: every stage claims the same rank of the
    group) and, on CPU, the tensor update (every rank rebuilds one
    shared-memory payload: the scheduler dies, measured) are refused."""
    pipeline = engine_config.ALL_TOPOLOGIES.get(topology, {}).get("pp_size", 1) > 1
    if op == "check_weights(compare)" and device != "cuda":
        return False
    if pipeline and (op == "update_weights(distributed)" or (op == "update_weights(tensor)" and device != "cuda")):
        return False  # refused under PP by ctx, for the measured reasons in docs/control-requests.md
    if phase == "pp_in_flight" and not pipeline:
        return False
    if op.startswith(("release(", "resume(")) and phase in BUSY_PHASES:
        return False
    return True


@dataclass
class Stats:
    topology: str = ""
    device: str = "cpu"
    sglang_version: str = ""
    examples: int = 0  # programs run on the server
    cached: int = 0  # programs Hypothesis asked for again (answered from memory)
    skipped: int = 0  # programs not run because the time budget was spent
    shrink_examples: int = 0  # of ``examples``: run while shrinking a failure
    steps: int = 0
    reset_steps: int = 0
    outputs_compared: int = 0  # greedy outputs the output oracle compared with their reference
    failures: Dict[str, int] = field(default_factory=dict)  # signature -> programs that failed so
    known: Dict[str, int] = field(default_factory=dict)  # known SGLang bug name -> programs that hit it
    restarts: int = 0
    wall_s: float = 0.0  # the whole exploration, server start excluded
    start_s: float = 0.0  # server start
    first_failure_s: Optional[float] = None  # from the start of the search (server start excluded)
    # Where the time of the examples went (seconds, summed over examples)
    script_s: float = 0.0  # scheduler side: the program's iterations (steps + io)
    io_s: float = 0.0  # of script_s: HTTP posts and arrival waits
    reset_s: float = 0.0  # scheduler side: the engine reset before each program
    ipc_s: float = 0.0  # harness <-> scheduler round trip beyond the scheduler's own time
    restart_s: float = 0.0
    windows: Dict[str, Dict[str, int]] = field(default_factory=dict)  # name -> reached/entered
    coverage: Dict[str, int] = field(default_factory=dict)  # "op|phase" -> count
    # abstract state (scheduler_side/abstract_state.py key) -> seconds into the search it was first
    # reached: the distinct states are the coverage figure, the times its series over time
    states: Dict[str, float] = field(default_factory=dict)
    novel_programs: int = 0  # programs that reached a state no program before them had
    novelty: bool = False  # the search was guided by novelty (novelty.py)
    guided_programs: int = 0  # of ``examples``: mutants of a novel program (with ``novelty``)

    def add(self, outcome, *, shrinking: bool, known: str = "", at_s: float = 0.0) -> int:
        """Count one program; ``known``: the registered SGLang bug its
        failure is (counted apart from new failures); ``at_s``: seconds
        into the search, when its new states count as first reached.
        Returns how many of its abstract states are new."""
        new = self.add_states(outcome.states, at_s)
        self.novel_programs += 1 if new else 0
        self.examples += 1
        self.shrink_examples += 1 if shrinking else 0
        self.steps += outcome.steps
        self.reset_steps += outcome.reset_steps
        self.outputs_compared += getattr(outcome, "outputs_compared", 0)
        script = max(0.0, outcome.run_s - outcome.reset_s)
        self.script_s += script
        self.io_s += outcome.io_s
        self.reset_s += outcome.reset_s
        self.ipc_s += max(0.0, outcome.wall_s - outcome.run_s)
        self.restart_s += outcome.restart_s
        if known:
            self.known[known] = self.known.get(known, 0) + 1
        elif outcome.signature:
            self.failures[outcome.signature] = self.failures.get(outcome.signature, 0) + 1
        for name, counts in outcome.windows.items():
            mine = self.windows.setdefault(name, {"reached": 0, "entered": 0})
            mine["reached"] += counts.get("reached", 0)
            mine["entered"] += counts.get("entered", 0)
        for key, n in outcome.coverage.items():
            self.coverage[key] = self.coverage.get(key, 0) + n
        return new

    def add_states(self, keys: Iterable[str], at_s: float) -> int:
        """Record abstract states reached ``at_s`` seconds into the search;
        how many were never reached before."""
        states = self.states
        new = 0
        for key in keys:
            if key not in states:
                states[key] = at_s
                new += 1
        return new

    def states_by_minute(self) -> List[int]:
        """Distinct abstract states reached by the end of each minute of the
        search, one entry per minute begun (the last is the total)."""
        minutes = max(1, math.ceil(self.wall_s / 60.0))
        return [self.states_reached_by(60.0 * m) for m in range(1, minutes + 1)]

    def states_reached_by(self, seconds: float) -> int:
        """Distinct abstract states reached in the first ``seconds`` of the search."""
        return sum(1 for at in self.states.values() if at <= seconds)

    def merge(self, other: "Stats") -> None:
        for name in ("examples", "cached", "skipped", "shrink_examples", "steps", "reset_steps", "restarts",
                     "outputs_compared",
                     "script_s", "io_s", "reset_s", "ipc_s", "restart_s"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.wall_s = max(self.wall_s, other.wall_s)
        self.start_s = max(self.start_s, other.start_s)
        if other.first_failure_s is not None:
            self.first_failure_s = min(x for x in (self.first_failure_s, other.first_failure_s) if x is not None)
        for sig, n in other.failures.items():
            self.failures[sig] = self.failures.get(sig, 0) + n
        for name, n in other.known.items():
            self.known[name] = self.known.get(name, 0) + n
        for name, counts in other.windows.items():
            mine = self.windows.setdefault(name, {"reached": 0, "entered": 0})
            for k in ("reached", "entered"):
                mine[k] += counts.get(k, 0)
        for key, n in other.coverage.items():
            self.coverage[key] = self.coverage.get(key, 0) + n
        for key, at in other.states.items():
            self.states[key] = min(at, self.states.get(key, at))
        self.novel_programs += other.novel_programs  # novel to its own worker
        self.guided_programs += other.guided_programs
        self.novelty = self.novelty or other.novelty
        self.topology = self.topology or other.topology
        if other.device != "cpu":  # a merged run keeps its workers' device (Stats() starts as cpu)
            self.device = other.device
        self.sglang_version = self.sglang_version or other.sglang_version

    @property
    def per_minute(self) -> float:
        return 60.0 * self.examples / self.wall_s if self.wall_s > 0 else 0.0

    def time_split(self) -> Dict[str, float]:
        """Seconds of the search by where they went; the rest of the wall
        time is the harness side (Hypothesis drawing and shrinking, source
        generation, bookkeeping)."""
        known = self.script_s + self.reset_s + self.ipc_s + self.restart_s
        return {"steps": max(0.0, self.script_s - self.io_s), "HTTP": self.io_s, "resets": self.reset_s,
                "harness IPC": self.ipc_s, "restarts": self.restart_s,
                "generation+shrinking": max(0.0, self.wall_s - known)}

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Stats":
        return cls(**data)

    # --- printing -----------------------------------------------------------------
    def summary(self) -> str:
        lines = [
            f"explored {self.topology} (sglang {self.sglang_version or '?'}): {self.examples} programs in "
            f"{self.wall_s:.1f}s = {self.per_minute:.0f}/min; {self.steps} steps "
            f"(+{self.reset_steps} reset steps); server start {self.start_s:.1f}s; "
            f"restarts {self.restarts}; {self.outputs_compared} greedy outputs compared",
        ]
        if self.cached or self.skipped or self.shrink_examples:
            lines.append(f"  {self.shrink_examples} of them while shrinking; {self.cached} repeats answered "
                         f"from memory; {self.skipped} not run (time budget spent)")
        if self.script_s + self.reset_s + self.ipc_s + self.restart_s > 0:
            lines.append("  time: " + ", ".join(
                f"{name} {sec:.1f}s ({100 * sec / max(self.wall_s, 1e-9):.0f}%)"
                for name, sec in self.time_split().items()))
        if self.failures:
            lines.append("  failures: " + "; ".join(f"{sig} x{n}" for sig, n in self.failures.items()))
        else:
            lines.append("  failures: none")
        if self.known:
            lines.append("  known SGLang bugs hit: " + "; ".join(f"known: {name} x{n}"
                                                            for name, n in self.known.items()))
        if self.windows:
            lines.append("  windows (reached/entered): " + ", ".join(
                f"{name} {c['reached']}/{c['entered']}" for name, c in sorted(self.windows.items())))
        lines.append("  " + self.states_line())
        return "\n".join(lines)

    def states_line(self) -> str:
        """The abstract-state coverage, its series per minute and the guidance."""
        guidance = (f"novelty guidance on: {self.guided_programs} programs mutated from them" if self.novelty
                    else "novelty guidance off")
        return (f"abstract states: {len(self.states)} distinct, by minute "
                f"{', '.join(str(n) for n in self.states_by_minute())}; {self.novel_programs} novel programs; "
                + guidance)

    def coverage_table(self) -> str:
        """Control operation x scheduler phase: how many operations were
        processed against a state in that phase ('.' = never)."""
        # rows of extension actions, HiCache's gate, LoRA, KV pressure, and feature phases, where they were seen
        extension_rows = tuple(sorted({key.split("|")[0] for key in self.coverage
                                       if key.startswith(("ext:", "hicache:", "lora:", "kv:", "fuzz:"))}))
        width = max(len(op) for op in OPS + extension_rows)
        seen = {key.split("|")[-1] for key in self.coverage}
        cols = PHASES + tuple(c for c in FEATURE_PHASES if c in seen)
        head = "  " + "op".ljust(width) + " | " + " | ".join(c.rjust(max(5, len(c))) for c in cols)
        rows = [head, "  " + "-" * (len(head) - 2)]
        for op in OPS + extension_rows:
            cells = []
            for c in cols:
                n = self.coverage.get(f"{op}|{c}", 0)
                cells.append((str(n) if n else ".").rjust(max(5, len(c))))
            rows.append("  " + op.ljust(width) + " | " + " | ".join(cells))
        exercised = sum(1 for op in OPS for c in cols if self.coverage.get(f"{op}|{c}"))
        possible = [(op, c) for op in OPS for c in cols if can_occur(op, c, self.topology, self.device)]
        of_possible = sum(1 for op, c in possible if self.coverage.get(f"{op}|{c}"))
        rows.append(f"  {exercised} of {len(OPS) * len(cols)} combinations exercised; {of_possible} of the "
                    f"{len(possible)} that can occur on {self.topology or 'this topology'} "
                    f"({100 * of_possible / max(1, len(possible)):.0f}%)")
        return "\n".join(rows)


    def fuzz_table(self) -> str:
        """Request fuzzing's drawn field cases: per field, how many requests
        drew a value of each class (valid, refused, unchecked), and the cases
        never drawn. Empty without request fuzzing."""
        from scripted_runtime.scheduler_side import request_fuzz

        drawn = {key[len("fuzzcase:"):]: n for key, n in self.coverage.items() if key.startswith("fuzzcase:")}
        if not drawn:
            return ""
        fields: Dict[str, Dict[str, int]] = {}
        for case in request_fuzz.CASES:
            fields.setdefault(case.field, {c: 0 for c in request_fuzz.CLASSES})
            fields[case.field][case.cls] += drawn.get(case.name, 0)
        width = max(len(f) for f in fields)
        head = "  " + "request field".ljust(width) + " | " + " | ".join(c.rjust(9) for c in request_fuzz.CLASSES)
        rows = [head, "  " + "-" * (len(head) - 2)]
        for name, counts in fields.items():
            rows.append("  " + name.ljust(width) + " | "
                        + " | ".join((str(counts[c]) if counts[c] else ".").rjust(9) for c in request_fuzz.CLASSES))
        never = [c.name for c in request_fuzz.CASES if c.name not in drawn]
        rows.append(f"  {len(drawn)} of {len(request_fuzz.CASES)} field cases drawn"
                    + (f"; never: {', '.join(never)}" if never else ""))
        return "\n".join(rows)


def merge_all(parts: List[Stats]) -> Stats:
    out = Stats()
    for part in parts:
        out.merge(part)
    return out
