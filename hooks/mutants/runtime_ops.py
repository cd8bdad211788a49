"""Mutants of the runtime knobs, weight queries, tensor updates, sessions and
weight-version labels
(issue 35's ``set_internal_state``, ``weights_checker``,
``update_weights_from_tensor``, ``update_weights_from_distributed``, ``close_session``), written with the operations
before the explorer drew them: their ``expected`` is what should notice
each, measured in the kill table."""
from __future__ import annotations

from typing import Any

from scripted_runtime.hooks.mutants.base import (ALL, WEIGHT_CHECKER, find_attr, find_method, find_module, mutant,
                                                 replace_attr, scheduler_class, weight_updater_manager, without_flush)


@mutant("mut_micro_batch_limit_read_once", topologies=ALL,
        summary="admission keeps the micro-batch limit it read first; set_internal_state changes nothing it uses",
        expected="contract runtime_limits (a prefill past the limit set_internal_state lowered)")
def _install_mut_micro_batch_limit_read_once(scheduler_module: Any) -> None:
    """``get_num_allocatable_reqs`` budgets with the
    ``pp_max_micro_batch_size`` it read at its first call, not the one in
    force: ``set_internal_state`` answers ``updated=True`` and the served
    config holds the new value, but admission never sees it.

    Plausible: a hot path caching a config value "that never changes" (it
    is a server argument) from before the runtime override existed. Done by
    shifting the running count it is given by the difference between the
    first value and the current one (its only use of either).

    Seen by: contract runtime_limits, once a program lowers the limit below
    what several queued requests need: the next prefill admits past it."""
    name = "mut_micro_batch_limit_read_once"
    cls = scheduler_class(scheduler_module, name)
    original = find_method(cls, "get_num_allocatable_reqs", name, ("running_bs",))
    from sglang.srt.runtime_context import get_parallel

    def get_num_allocatable_reqs(self, running_bs, *args, **kwargs):
        current = get_parallel().pp_max_micro_batch_size
        first = self.__dict__.setdefault("_mut_first_micro_batch_limit", current)
        return original(self, running_bs - (first - current), *args, **kwargs)  # MUTANT: the first limit

    replace_attr(cls, "get_num_allocatable_reqs", get_num_allocatable_reqs, original)


@mutant("mut_weight_checksum_cached", topologies=ALL,
        summary="check_weights(checksum) answers the checksum it computed first, whatever the weights are now",
        expected="contract weight_queries (the same checksum for different weights, after a weight update)")
def _install_mut_weight_checksum_cached(scheduler_module: Any) -> None:
    """The weight checker's ``checksum`` caches its first result on the
    checker and answers it again: a weight update, a release or a
    ``reset_tensors`` never shows in the checksum an RL framework compares
    against the trainer's.

    Plausible: hashing every tensor is slow, and a cache invalidated "when
    the weights change" misses the update paths that load in place. Done by
    keeping the first answer on the ``WeightChecker``.

    Seen by: contract weight_queries, for a checksum after a weight update
    to another checkpoint in a program that took one before it."""
    name = "mut_weight_checksum_cached"
    scheduler_class(scheduler_module, name)
    cls = find_attr(find_module(WEIGHT_CHECKER, name), "WeightChecker", name, f"{WEIGHT_CHECKER}.WeightChecker")
    original = find_method(cls, "_compute_checksum", name, ("skip_tensor_list",))

    def _compute_checksum(self, skip_tensor_list=None, **kwargs):
        cached = self.__dict__.get("_mut_first_checksum")
        if cached is None:
            cached = self.__dict__["_mut_first_checksum"] = original(self, skip_tensor_list, **kwargs)
        return cached  # MUTANT: the first checksum, whatever the weights are now

    replace_attr(cls, "_compute_checksum", _compute_checksum, original)


@mutant("mut_tensor_update_skips_flush", topologies=ALL, unreachable_on=("cpu:pp4",),
        summary="update_weights_from_tensor loads the tensors and answers success without flushing the cache",
        expected="contract update_weights (the tree still holds tokens right after an accepted update with flush), "
                 "output oracle (a prefix hit reads KV computed under the old weights)")
def _install_mut_tensor_update_skips_flush(scheduler_module: Any) -> None:
    """The tensor path of the weight update skips
    ``flush_cache_after_weight_update``: it loads the new weights and answers
    success, while the radix tree keeps KV the old weights computed.

    Plausible: a trainer sends its weights in many buckets, so "flush once,
    at the end of the session" is an easy optimisation to make in one path
    and not the other; the disk path keeps its flush, so tests of it pass.
    Done by handing the handler a flush that reports success and does
    nothing for that one call.

    Seen by: contract update_weights (an accepted update with
    ``flush_cache=True`` leaves the tree non-empty), and the output oracle
    for a request after the update that hits a prefix cached before it.

    Not on pp4 with the CPU default: there the tensor update itself cannot
    run (every rank rebuilds the same shared-memory payload, which kills the
    scheduler, measured: docs/control-requests.md), so ``ctx`` refuses it and
    the explorer updates from disk; the handler this breaks never runs."""
    name = "mut_tensor_update_skips_flush"
    # the tensor path keeps the old weights' cache
    without_flush(weight_updater_manager(scheduler_module, name), "update_weights_from_tensor", name)


@mutant("mut_distributed_update_loads_into_no_runner", topologies=ALL, unreachable_on=("cpu:pp4", "cuda:pp4"),
        summary="update_weights_from_distributed receives the broadcast, loads it into no runner and answers success",
        expected="contract update_weights (an accepted broadcast update leaves weights other than its "
                 "checkpoint's)")
def _install_mut_distributed_update_loads_into_no_runner(scheduler_module: Any) -> None:
    """The distributed handler resolves its ``selector`` to no runner: it
    receives the trainer's broadcast, loads it nowhere, then records the
    weight version, flushes and answers success, so the trainer believes
    the engine serves its weights.

    Plausible: the handler's runner list is built by the same selector
    parser as the draft worker's; a parser that reads ``"all"`` against the
    draft roles (empty without speculative decoding) yields nothing, and a
    loop over nothing leaves the initial success standing. The tensor path
    selects its own runners, so its tests pass. Done by handing this one
    handler an empty runner list.

    Seen by: contract update_weights (the weights after the accepted
    update are not its checkpoint's). The output oracle alone does not see
    it: it compares against references under whatever weights are served
    (measured: the mutant survived 387 programs before the contract had
    that rule). Not on pp4 with the CPU default: the distributed update cannot run
    under PP (every stage claims the same rank of the group), so the
    explorer updates from disk there and this handler never runs."""
    name = "mut_distributed_update_loads_into_no_runner"
    cls = weight_updater_manager(scheduler_module, name)
    original = find_method(cls, "update_weights_from_distributed", name, ("recv_req",))
    select = find_method(cls, "_select_runners", name, ("selector",))
    inside = [False]  # the manager has __slots__: the handler's call is marked here, not on it

    def _select_runners(self, selector="all"):
        return [] if inside[0] else select(self, selector)  # MUTANT: no runner while the handler asks

    def update_weights_from_distributed(self, recv_req):
        inside[0] = True
        try:
            return original(self, recv_req)
        finally:
            inside[0] = False

    replace_attr(cls, "_select_runners", _select_runners, select)
    replace_attr(cls, "update_weights_from_distributed", update_weights_from_distributed, original)


@mutant("mut_session_close_always_deferred", topologies=ALL,
        summary="close_session defers every close to the reaper, even of a session with no unfinished request",
        expected="contract sessions (a closed idle session is still open right after the close)")
def _install_mut_session_close_always_deferred(scheduler_module: Any) -> None:
    """``SessionController._close`` marks every session ``close_on_finish``
    and returns, leaving the release to the reaper (which runs on the wall
    clock, once a second), even when no request of the session is
    unfinished.

    Plausible: "the reaper finishes deferred closes anyway, so always defer
    and keep the dispatcher cheap". Visible to a client: an ``open_session``
    of the same id right after the close is refused (the id still exists),
    and the session's radix KV stays held until the reaper runs.

    Seen by: contract sessions at the close (an open session with no
    unfinished request is still open, only marked)."""
    name = "mut_session_close_always_deferred"
    scheduler_class(scheduler_module, name)
    module = find_module("sglang.srt.session.session_controller", name)
    cls = find_attr(module, "SessionController", name, "sglang.srt.session.session_controller.SessionController")
    original = find_method(cls, "_close", name, ("session_id",))

    def _close(self, session_id):
        session = self.sessions[session_id]
        session.close_on_finish = True  # MUTANT: deferred to the reaper, request or not
        return None

    replace_attr(cls, "_close", _close, original)


PROFILER_MANAGER = "sglang.srt.managers.scheduler_components.profiler_manager"


@mutant("mut_profile_num_steps_ignored", topologies=ALL,
        summary="a profile started with num_steps and no start_step never stops by itself",
        expected="contract diagnostics (a profile started with num_steps still runs past its target)")
def _install_mut_profile_num_steps_ignored(scheduler_module: Any) -> None:
    """``SchedulerProfilerManager._init_profile`` sets the forward count at
    which a profile stops itself only when the request also names a
    ``start_step``: ``/start_profile {"num_steps": N}`` profiles until a
    ``/stop_profile`` comes, and one never comes from a client that asked
    for N steps (the trace is never written, the profiler's overhead stays).

    Plausible: the ``num_steps`` branch sits next to the ``start_step`` one,
    and a refactor that moves it under ``if start_step:`` passes every test
    that starts at a step.

    Seen by: contract diagnostics, which computes the target from the
    request (the forward count at the start + num_steps + 1), once the
    scheduler ran past it with the profile still running."""
    name = "mut_profile_num_steps_ignored"
    scheduler_class(scheduler_module, name)
    cls = find_attr(find_module(PROFILER_MANAGER, name), "SchedulerProfilerManager", name,
                    f"{PROFILER_MANAGER}.SchedulerProfilerManager")
    original = find_method(cls, "_init_profile", name, ("output_dir", "start_step", "num_steps"))

    def _init_profile(self, output_dir, start_step, num_steps, *args, **kwargs):
        out = original(self, output_dir, start_step, num_steps, *args, **kwargs)
        if not start_step:
            self.profiler_target_forward_ct = None  # MUTANT: num_steps honoured only with a start_step
        return out

    replace_attr(cls, "_init_profile", _init_profile, original)


@mutant("mut_weight_version_event_names_new_version", topologies=ALL,
        summary="a weight-version change records the version just set, not the one that made the tokens so far",
        expected="weight-version contract (an answer labels tokens made before a version change with the new "
                 "version)")
def _install_mut_weight_version_event_names_new_version(scheduler_module: Any) -> None:
    """``Scheduler.record_weight_version_change`` overrides the served
    version first and then records, on every live request with output, the
    version its tokens so far were made under (``old_version``). The mutant
    records the version served at the time of the call, which is already
    the new one: every answer then labels the tokens it made before the
    change with the version after it, and an RL trainer that drops tokens
    of stale weights keeps them.

    Plausible: the event's field reads "the version change"; moving the
    override above the recording (as 0.5.23 has it) turns a "current
    version" read into the new one. Done by wrapping the scheduler's
    ``record_weight_version_events`` to pass the served version.

    Seen by: the weight-version contract (end check weight_versions), for a request with output live
    across ``update_weight_version`` or a labelled weight update (a pause,
    or a label change while it decodes)."""
    name = "mut_weight_version_event_names_new_version"
    scheduler_class(scheduler_module, name)
    original = find_attr(scheduler_module, "record_weight_version_events", name,
                         "scheduler.record_weight_version_events")
    get_serving = find_attr(scheduler_module, "get_serving", name, "scheduler.get_serving")

    def record_weight_version_events(reqs, old_version):
        return original(reqs, old_version=get_serving().weight_version)  # MUTANT: the version just set

    replace_attr(scheduler_module, "record_weight_version_events", record_weight_version_events, original)
