"""What ``ScriptedServer.run`` returns."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple


@dataclass
class ScriptResult:
    script: str
    passed: bool
    steps: int = 0
    reset_steps: int = 0
    duration_s: float = 0.0
    error: Optional[str] = None  # one line
    traceback: Optional[str] = None
    crashed: bool = False  # the scheduler died during the script
    crashed_in_reset: bool = False  # ... in the reset before it: what the previous script left broke it
    control_log: List[Dict[str, Any]] = field(default_factory=list)
    # whether control_log is what the script posted: False for a crash whose driver sent none
    control_log_known: bool = True
    value: Any = None
    violation: Optional[Dict[str, Any]] = None  # the invariant that failed the script
    windows: Dict[str, Dict[str, int]] = field(default_factory=dict)  # name -> reached/open_steps/entered
    timeline: str = ""  # last steps of the trace (on failure)
    trace_path: Optional[str] = None  # the JSONL step trace of this run
    reset_s: float = 0.0  # of duration_s: the engine reset before the script
    io_s: float = 0.0  # of duration_s: HTTP posts and arrival waits of the script
    # (file, line, function) of the script's generator frames, outermost first,
    # where it stood when it failed
    script_stack: Optional[List[Tuple[str, int, str]]] = None
    # the distinct abstract states it reached (``run(..., abstract_states=True)``; scheduler_side/abstract_state.py)
    states: Tuple[str, ...] = ()
    # when the script failed and the scheduler then died in the engine reset right after it (the
    # crash became the script's failure): the script's own failure as it was, (error, violation)
    own_failure: Optional[Tuple[Optional[str], Optional[Dict[str, Any]]]] = None

    def summary(self) -> str:
        verdict = "PASS" if self.passed else ("CRASH" if self.crashed else "FAIL")
        line = f"{verdict} {self.script}: {self.steps} steps in {self.duration_s:.2f}s"
        if self.error:
            line += f"\n  {self.error}"
        if self.crashed_in_reset:
            line += ("\n  (it died in the engine reset, before this script's first step: what the script "
                     "before it left behind broke the scheduler; run this one on a fresh server)")
        if not self.passed and self.timeline:
            line += "\n  last steps (>> marks the violation):\n" + "\n".join(
                "    " + l for l in self.timeline.splitlines())
        if not self.passed and self.trace_path:
            line += f"\n  trace: {self.trace_path}"
        return line

    def windows_reached(self) -> Dict[str, int]:
        """Windows that opened at least once in this run, with their count."""
        return {name: st["reached"] for name, st in self.windows.items() if st.get("reached")}

    def raise_if_failed(self) -> "ScriptResult":
        if not self.passed:
            raise ScriptFailedError(self)
        return self


class ScriptFailedError(AssertionError):
    def __init__(self, result: ScriptResult) -> None:
        self.result = result
        super().__init__(f"{result.summary()}\n{result.traceback or ''}")


def violation_signature(violation: Dict[str, Any]) -> str:
    """``InvariantViolation[NAME]`` or ``ContractViolation[NAME]`` of a
    result's violation record (its ``kind``; older records lack it)."""
    return f"{violation.get('kind') or 'InvariantViolation'}[{violation['invariant']}]"
