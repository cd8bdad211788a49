"""Mutants of release/resume_memory_occupation, the RL weight-sync cycle's
memory steps (``SchedulerWeightUpdaterManager`` in 0.5.23
``scheduler_components/weight_updater.py``). Written with the operations
(issue 35), before the explorer drew them: their ``expected`` is what
should notice each, measured in the kill table."""
from __future__ import annotations

from typing import Any

from scripted_runtime.hooks.mutants.base import (ALL, find_method, mutant, replace_attr, weight_updater_manager,
                                                 without_flush)


@mutant("mut_release_keeps_cache_while_paused", topologies=ALL,
        summary="release_memory_occupation(kv_cache) skips its cache flush while the engine is paused",
        expected="contract memory_occupation (the tree still holds tokens right after the release), "
                 "output oracle (a prefix hit reads KV the release lost)")
def _install_mut_release_keeps_cache_while_paused(scheduler_module: Any) -> None:
    """``release_memory_occupation`` does not flush the cache when the
    engine is paused: the radix tree keeps its nodes over KV whose memory
    is released.

    Plausible: "a paused engine keeps its cache for the requests it will
    resume" (the in-place pause keeps state; the RL cycle is always paused).
    On a GPU the KV pages are unmapped and come back zeroed or reused, so a
    later prefix hit reads garbage. Done by handing the handler a flush that
    does nothing (its ``flush_cache`` field) for that one call.

    Seen by: contract memory_occupation at the release's iteration (tokens
    still in the tree after a release of kv_cache) after a pause with a
    request that left a prefix in the tree; the output oracle too, when the
    same prompt comes back after the cycle (the harness overwrites released
    KV on CPU). All topologies."""
    name = "mut_release_keeps_cache_while_paused"
    # the paused engine's cache is kept
    without_flush(weight_updater_manager(scheduler_module, name), "release_memory_occupation", name,
                  when=lambda self: self.scheduler is not None and getattr(self.scheduler, "_engine_paused", False))


@mutant("mut_resume_skips_static_state", topologies=ALL,
        summary="resume_memory_occupation(weights) does not put the model's stashed buffers back",
        expected="contract memory_occupation (the buffers differ from the release's after the resume), output "
                 "oracle (the rotary cache stays what the release left)")
def _install_mut_resume_skips_static_state(scheduler_module: Any) -> None:
    """``resume_memory_occupation`` with ``weights`` drops the static state
    ``release`` stashed (the model's buffers: the tiny model's rotary
    ``cos_sin_cache``) instead of importing it.

    Plausible: "the buffers never left" is true with the no-op memory saver
    and with a CPU backup, so an optimisation gated on the wrong condition
    skips the import; a weight update loads parameters only, so nothing else
    puts the buffers back. On a GPU the buffers are what the unmapped pages
    held. Done by emptying the stash before the handler imports it.

    Seen by: contract memory_occupation at the resume (the model's buffers
    are not those of the release), and the output oracle for a request sent
    after the cycle whose reference was computed before it (the explorer's
    warm-up; the harness overwrites released weights on CPU, buffers
    included, and the update restores the parameters, not the rotary cache).
    All topologies."""
    name = "mut_resume_skips_static_state"
    cls = weight_updater_manager(scheduler_module, name)
    original = find_method(cls, "resume_memory_occupation", name, ("recv_req",))

    def resume_memory_occupation(self, recv_req):
        tags = recv_req.tags or ("kv_cache", "weights", "cuda_graph")
        if "weights" in tags and self.stashed_model_static_state is not None:
            self.stashed_model_static_state = {"buffers": []}  # MUTANT: nothing of the stash is put back
        return original(self, recv_req)

    replace_attr(cls, "resume_memory_occupation", resume_memory_occupation, original)
