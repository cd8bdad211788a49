"""Once per script iteration (scheduler process): windows, invariants and
the step trace.

``observe_windows()`` runs at the start of an iteration, before the script
advances (so ``wait_for_window`` sees the state the iteration left);
``after_script()`` runs once the script yielded: one state scan feeds the
invariants and the trace record, so a violation is reported on the state the
next iteration is about to process, before SGLang's own checks run on it.
It also records the iteration's abstract state (``abstract_state.py``) when
the script was run with ``RunScript.abstract_states`` (the explorer's
programs), whatever the checks and the trace.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from scripted_runtime.hooks import sglang_compat
from scripted_runtime import protocol
from scripted_runtime.scheduler_side.abstract_state import AbstractStates
from scripted_runtime.scheduler_side.request_tracker import RequestTracker
from scripted_runtime.scheduler_side.control import ControlLedger
from scripted_runtime.scheduler_side.invariants import InvariantChecker, StateView, Violation
# after invariants, which registers every built-in check in the server's order
from scripted_runtime.scheduler_side import fill_ids_contract
from scripted_runtime.scheduler_side.rank_ops import KvPressure
from scripted_runtime.scheduler_side.run_counters import RunCounters
from scripted_runtime.scheduler_side import trace_record as trace_record
from scripted_runtime.timeline import format_timeline
from scripted_runtime.scheduler_side.windows import WindowTracker

TIMELINE_TAIL = 20


class StepObserver:
    """Owns the run's windows and checks; the script context and the driver
    ask it (``window_detail``, ``check_enabled``, ``dispatch_contracts``)
    rather than reaching into them."""

    def __init__(self, *, scheduler: Any, counters: RunCounters, tracker: RequestTracker,
                 ledger: ControlLedger, kv_holds: KvPressure) -> None:
        self._scheduler = scheduler
        self._counters = counters
        self._tracker = tracker
        self._ledger = ledger
        self._kv_holds = kv_holds
        self.windows = WindowTracker()
        self.invariants = InvariantChecker()
        self.writer = trace_record.TraceWriter(None)
        self.trace_enabled = True
        self.abstract = AbstractStates()
        self._open_now: Dict[str, str] = {}
        self._pending = False
        self._entered: List[str] = []
        self._batch_cursor = 0

    def begin(self, cmd: protocol.RunScript) -> None:
        self.windows.clear()
        self.invariants.reset(cmd.disabled_invariants)
        self.trace_enabled = cmd.trace
        self.abstract.begin(cmd.abstract_states)
        self.writer.close()
        self.writer = trace_record.TraceWriter(cmd.trace_path if cmd.trace else None)
        s = self._scheduler
        _, _, pp_size, _ = sglang_compat.rank_info(s)
        self.writer.write_header(trace_record.header(
            script=cmd.target.describe(), loop=sglang_compat.loop_kind(s), pp_size=pp_size,
            sglang_version=sglang_compat.installed_sglang_version(),
            invariants=self.invariants.enabled))
        self._open_now = {}
        self._pending = False
        self._entered = []
        self._batch_cursor = 0

    def observe_windows(self) -> None:
        """Start of an iteration, before the script advances: which windows are open."""
        s = self._scheduler
        self._open_now = self.windows.observe(s, sglang_compat.loop_kind(s))
        self._entered = []
        self._pending = True

    def note_entered(self, name: str) -> None:
        self.windows.mark_entered(name)
        self._entered.append(name)

    def window_detail(self, name: str) -> Optional[str]:
        """The detail of window ``name`` if it is open in this iteration, else None."""
        return self.windows.open.get(name)

    def window_stats(self) -> Dict[str, Dict[str, int]]:
        """Per window: reached, open_steps, entered (so far this run)."""
        return self.windows.report()

    def check_enabled(self, name: str) -> bool:
        """Whether check ``name`` runs in this script (not disabled by the run)."""
        return self.invariants.is_enabled(name)

    @property
    def judges_fill_ids(self) -> bool:
        """Whether the fill-ids contract runs in this script (the driver
        then records each extend's fill ids at its launch)."""
        return self.invariants.is_enabled(fill_ids_contract.NAME)

    @property
    def contracts_enabled(self) -> bool:
        """Whether any control-operation contract runs (the dispatcher then
        hands control requests to ``dispatch_contracts``)."""
        return self.invariants.contracts_enabled

    @property
    def dispatch_contracts(self) -> Any:
        """The contracts' bookkeeping of this script, fed by the dispatcher."""
        return self.invariants.memory.contracts

    def dispatch_observers(self, kind: str) -> List[Any]:
        """The contract bookkeepers (``contracts.ContractMemory``,
        ``runtime_contracts.RuntimeMemory``, ``lora_contract.LoraMemory``) that look at a control request
        of type ``kind`` when the dispatcher hands it to SGLang; none when
        every contract is off."""
        if not self.contracts_enabled:
            return []
        memory = self.invariants.memory
        return [m for m in (memory.contracts, memory.runtime, memory.lora) if kind in m.TYPES]

    def after_script(self) -> Optional[Violation]:
        """After the script advanced, before the scheduler ingests: scan once,
        check the invariants on the state the iteration is about to see
        (including anything the script changed), write this step's record."""
        if not self._pending:
            return None
        self._pending = False
        if self.abstract.enabled:
            ops, step = self._ledger.ops, self._counters.step
            self.abstract.observe(self._scheduler, [op for op in ops if op.processed_step == step] if ops else ())
        checking = self.invariants.per_iteration
        if not checking and not self.trace_enabled:
            return None  # nothing reads the scan
        counters = self._counters
        s = self._scheduler
        view = StateView(s, extra_held_tokens=self._kv_holds.tokens)
        violation = self.invariants.check(view, step=counters.step, batch_log=counters.batch_log,
                                          tracked=self._tracker.reqs) if checking else None
        if violation is not None:
            violation.step = counters.step
            violation.iteration = counters.iteration
        if not self.trace_enabled:
            return violation
        step = counters.step
        launched = counters.batch_log[self._batch_cursor:]
        self._batch_cursor = len(counters.batch_log)
        rec: Dict[str, Any] = {"step": step, "it": counters.iteration}
        rec.update(trace_record.snapshot(s, view))
        rec["launched"] = [{"slot": b.slot, "mode": b.mode, "rids": list(b.rids)} for b in launched]
        ops = self._ledger.ops
        rec["answers"] = [
            {"op": op.name, **op.scheduler_verdict()}  # not the HTTP answer: its timing varies
            for op in ops if op.processed_step == step
        ] if ops else []
        rec["windows"] = self._open_now
        rec["windows_opened"] = list(self.windows.opened_now)
        rec["entered"] = list(self._entered)
        rec["ops"] = [{"op": op.name} for op in ops if op.posted_step == step] if ops else []
        handles = self._tracker.handles
        rec["started"] = ([h.rid for h in handles if h.posted_step == step]
                          if handles and handles[-1].posted_step >= step else [])
        rec["violation"] = violation.as_dict() if violation is not None else None
        self.writer.append(rec)
        return violation

    def timeline_tail(self, n: int = TIMELINE_TAIL) -> str:
        if not self.writer.recent:
            return ""
        return format_timeline(self.writer.recent, last=n)

    def end(self) -> Dict[str, Dict[str, int]]:
        """Close the trace; the run's window counts."""
        self.writer.close()
        return self.windows.report()

    def abstract_states(self) -> Tuple[str, ...]:
        """The abstract states this script reached (keys; empty unless
        ``RunScript.abstract_states``)."""
        return self.abstract.keys() if self.abstract.enabled else ()
