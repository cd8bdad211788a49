"""Mutants of priority scheduling (issue 35's request-level features:
``enable_priority_scheduling`` on the ``pp1-priority`` topology), written
with the ``priority`` contract, before the explorer drew a priority. Their
``expected`` is what should notice each, measured in the kill table."""
from __future__ import annotations

from typing import Any

from scripted_runtime.hooks.mutants.base import (PRIORITY, SCHEDULE_POLICY, find_attr, find_method, find_module,
                                                 mutant, replace_attr, scheduler_class)


@mutant("mut_priority_preemption_threshold_dropped", topologies=PRIORITY,
        summary="preemption compares the priority gap with 0, not the server's preemption threshold: any "
                "strictly better priority preempts a running request",
        expected="contract priority (a request preempted by none better by more than the threshold)")
def _install_mut_priority_preemption_threshold_dropped(scheduler_module: Any) -> None:
    """``PrefillAdder.preempt_to_schedule`` preempts a running request only
    when the waiting one is better by more than
    ``priority_scheduling_preemption_threshold`` (10 by default, the
    scheduler passes it to the adder's constructor, whose own default is
    0). Here the comparison runs against 0: a waiting request better by 1
    preempts a running one.

    Plausible: the adder takes the threshold as its ninth positional
    parameter with a default of 0, so a call that drops or shifts one
    argument leaves exactly this; and every test whose priorities are 100
    apart, or absent, behaves the same.

    Seen by: the ``priority`` contract, once a request better than a
    running one by at most the threshold arrives while the running slots
    are full: the victim's preemptor is not better by more than the
    threshold the scheduler holds."""
    name = "mut_priority_preemption_threshold_dropped"
    scheduler_class(scheduler_module, name)
    cls = find_attr(find_module(SCHEDULE_POLICY, name), "PrefillAdder", name, f"{SCHEDULE_POLICY}.PrefillAdder")
    original = find_method(cls, "preempt_to_schedule", name, ("req",))

    def preempt_to_schedule(self, req, *args, **kwargs):
        kept = self.priority_scheduling_preemption_threshold
        self.priority_scheduling_preemption_threshold = 0  # MUTANT: the gap compared with 0
        try:
            return original(self, req, *args, **kwargs)
        finally:
            self.priority_scheduling_preemption_threshold = kept

    replace_attr(cls, "preempt_to_schedule", preempt_to_schedule, original)
