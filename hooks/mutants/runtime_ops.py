"""Mutants of the runtime knobs and weight queries (issue 35's
``set_internal_state`` and ``weights_checker``), written with the operations
before the explorer drew them: their ``expected`` is what should notice
each, measured in the kill table."""
from __future__ import annotations

from typing import Any

from scripted_runtime.hooks.mutants.base import (ALL, WEIGHT_CHECKER, find_attr, find_method, find_module, mutant,
                                                 replace_attr, scheduler_class)


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
