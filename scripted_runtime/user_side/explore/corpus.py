"""The seed corpus: explicit programs every search runs first (harness process).

A bounded random search draws some program shapes rarely: a retract pause
in the iteration right after a prefill, a weight update with
``flush_cache`` while an in-place pause holds a decoding request, an abort
in mid-decode on pp=4. Each is one control operation landing in one request
phase, so the corpus is that grid, written down once: every operation
sequence of ``OPERATIONS`` applied in every phase of ``phases(topology)``.
It is built from the operations and the scheduler's request phases, not
from any particular bug, and Hypothesis runs it in its ``explicit`` phase
(``@example``) before it generates anything.

A corpus program that fails is reported unshrunk: it is short already. Its
requests are the plain ones (``ignore_eos``, no stop token): prompts of
families 0, 1 and 2 (distinct prefixes), the ``prefix_hit`` phase's two of
one family (the longer shares the shorter's prefix).
"""
from __future__ import annotations

from typing import Dict, List, Tuple

from scripted_runtime.user_side.explore import actions as A
from scripted_runtime.user_side.explore.strategies import LOOP_OF_TOPOLOGY

# Iterations that bring a request into decoding (a PP iteration is one
# microbatch slot: a request advances once per round of 4 slots).
DECODE_STEPS = {"pp1-overlap": 4, "pp1-normal": 4, "pp4": 12, "pp1-hicache": 4, "pp1-lora": 4, "pp1-priority": 4,
                "pp1-text": 4}
NEW_TOKENS = 12


def phases(topology: str) -> Dict[str, List[A.Action]]:
    """Request phases, each as the program prefix that reaches it."""
    decode = DECODE_STEPS[topology]
    return {
        # posted, not scheduled yet (the operation arrives with it)
        "queued": [A.Start(8, 0, NEW_TOKENS)],
        # prefilled in the last iteration: on overlap its result is still in
        # flight, under PP it is in a slot; not merged into running_batch yet
        "prefill_ran": [A.Start(8, 0, NEW_TOKENS), A.Steps(1)],
        # a 3-chunk prompt between chunks (the chunked request holds its row)
        "mid_chunk": [A.Start(150, 1, NEW_TOKENS), A.Steps(2)],
        # decoding, locked on the root
        "decoding": [A.Start(8, 0, NEW_TOKENS), A.Steps(decode)],
        # decoding on a cached prefix (locked on a non-root node) beside a
        # request still in its chunks
        "prefix_hit": [A.Start(100, 2, NEW_TOKENS), A.Steps(decode), A.Start(129, 2, NEW_TOKENS),
                       A.Steps(decode)],
        # finished: right after its last token (not pruned yet on some loops), then idle
        "finished": [A.Start(8, 0, 2), A.Steps(decode)],
        # under PP: a request admitted into the micro-batch of one decoding (each slot has its
        # own running batch; a request otherwise joins whichever slot's turn it arrives in)
        **({"joined_decoding": [A.Start(8, 0, NEW_TOKENS), A.Steps(3), A.Start(8, 1, NEW_TOKENS, beside=0),
                                A.Steps(decode)]} if LOOP_OF_TOPOLOGY[topology] == "pp" else {}),
    }


def _knobs_and_queries(profile_wait: int) -> List[A.Action]:
    """Every runtime knob, weight query and session operation once, and a
    profile of two forwards left running ``profile_wait`` iterations."""
    return [A.SlowDown(1), A.SetLimit("above"), A.WeightQuery("server_info"), A.WeightQuery("version"),
            A.WeightQuery("get_weights"), A.WeightQuery("snapshot"), A.WeightQuery("compare"),
            A.WeightQuery("freeze_gc"), A.SlowDown(0), A.SessionOp("open"), A.SessionOp("reopen"),
            A.SessionOp("close"), A.WeightQuery("log_level"), A.WeightQuery("profile"), A.Steps(profile_wait),
            A.WeightQuery("profile_stop")]


def _session_turns(finish_wait: int) -> List[A.Action]:
    """A conversation (grammar 13): its first turn (a 2-chunk prompt, 4 new
    tokens), ``finish_wait`` iterations for it to finish, a turn continuing
    it (its history a prefix hit on what the first left in the tree), and
    the session closed while that turn runs (SGLang closes it when the turn
    finishes)."""
    return [A.Turn(None, 1, 65, 4), A.Steps(finish_wait), A.Turn(0, 2, 8, 4), A.SessionOp("close")]


# Operation sequences; a pause is always followed by its continue.
OPERATIONS: Dict[str, List[A.Action]] = {
    "flush": [A.Flush()],
    "update": [A.UpdateWeights(flush=True)],
    "update_no_flush": [A.UpdateWeights(flush=False)],
    # a weight update that fails (grammar 14): a checkpoint path that does not exist
    "update_missing": [A.UpdateWeights(flush=True, missing=True)],
    "abort_one": [A.AbortOne(0)],
    "abort_all": [A.AbortAll()],
    "pause_in_place": [A.Pause("in_place"), A.Steps(2), A.Continue()],
    "pause_retract": [A.Pause("retract"), A.Steps(2), A.Continue()],
    "update_in_place_pause": [A.Pause("in_place"), A.UpdateWeights(flush=True), A.Continue()],
    "update_retract_pause": [A.Pause("retract"), A.UpdateWeights(flush=True), A.Continue()],
    # issue 35: the third pause mode and the RL weight-sync cycle's memory steps
    "pause_abort": [A.Pause("abort"), A.Steps(2), A.Continue()],
    "release_resume": [A.ReleaseMemory("all"), A.Steps(1), A.ResumeMemory()],
    "rl_cycle_retract_all": [A.RlCycle("retract", "all", 1)],
    "rl_cycle_abort_kv": [A.RlCycle("abort", "kv_cache", 0)],
    "rl_cycle_in_place_weights": [A.RlCycle("in_place", "weights", 1)],
    # issue 35: runtime knobs and weight queries (grammar 7). The limit lowered with two more
    # requests arriving (admission must keep to it), then put back; checksums around an update
    # (they must follow the weights); every other knob and query once.
    "limit_one": [A.SetLimit("1"), A.Start(8, 1, NEW_TOKENS), A.Start(65, 2, NEW_TOKENS), A.Steps(4),
                  A.SetLimit("default")],
    "checksums_around_update": [A.WeightQuery("checksum"), A.UpdateWeights(flush=True), A.WeightQuery("checksum")],
    # the trainer's path: the same weights as tensors, inside a begin/end session, while paused
    "tensor_update_retract_pause": [A.Pause("retract"), A.UpdateWeights(flush=True, tensor=True), A.Continue()],
    # the trainer's broadcast (grammar 10): an RL weight sync whose update the trainer rank broadcasts
    # after a release that lost the weights, then the next rollout's request on the new weights
    "rl_cycle_broadcast_then_rollout": [A.RlCycle("retract", "weights", 1, distributed=True),
                                        A.Start(64, 1, NEW_TOKENS)],
    # (a profile of two forwards, then eight iterations, 24 under PP: past its target, it must have
    # stopped itself; ``operations`` gives PP its wait)
    "knobs_and_queries": _knobs_and_queries(profile_wait=8),
    # KV pressure as two short requests arrive together: room for either alone, not both (SGLang's
    # admission must charge the first's extend before it admits the second; with every page but 14
    # taken and the cache evicted, 8 + 1 fits, 8 + 1 + 8 + 1 does not)
    "kv_pressure_two_arrive": [A.ExhaustKv(14, evict_cache=True), A.Start(8, 1, 1), A.Start(8, 2, 1),
                               A.Steps(4), A.ReleaseKv()],
    # a session's second turn after its first finished, the session closed while it runs (the
    # first turn's 12 iterations, 36 under PP: ``operations``)
    "session_turns": _session_turns(finish_wait=12),
}


def operations(topology: str) -> Dict[str, List[A.Action]]:
    """``OPERATIONS`` as run on ``topology``: the profile's wait and the
    first session turn's in micro-batch rounds under PP (a PP iteration is
    one micro-batch slot, so a request advances once per round of slots)."""
    scale = DECODE_STEPS[topology] // DECODE_STEPS["pp1-normal"]
    if scale == 1:
        return OPERATIONS
    return {**OPERATIONS, "knobs_and_queries": _knobs_and_queries(profile_wait=8 * scale),
            "session_turns": _session_turns(finish_wait=12 * scale)}


def hicache_phases(topology: str) -> Dict[str, List[A.Action]]:
    """HiCache's phases (pp1-hicache's 400-token device pool), each reached
    with the transfer gate holding what is in flight."""
    decode = DECODE_STEPS[topology]
    return {
        # a prefix evicted to the host by two others, asked for again while
        # loads are held: its load-back is pending (copied by the extend
        # batch's wait, not acknowledged) while the request decodes
        "load_held": [A.Start(192, 0, 2), A.Steps(8), A.Start(192, 1, 2), A.Steps(8), A.Start(192, 2, 2),
                      A.Steps(8), A.HoldTransfers(loads=True, backups=False), A.Start(192, 0, NEW_TOKENS),
                      A.Steps(decode)],
        # a finished request whose write-through backup is held (its node
        # locked, its device slots read by the pending copy) while two new
        # prompts need more of the device pool than is free
        "backup_held": [A.HoldTransfers(loads=False, backups=True), A.Start(100, 0, 2), A.Steps(decode),
                        A.Start(192, 1, NEW_TOKENS), A.Start(192, 2, NEW_TOKENS), A.Steps(2)],
    }


def lora_phases(topology: str) -> Dict[str, List[A.Action]]:
    """Phases of requests served with LoRA adapters (two slots a batch)."""
    decode = DECODE_STEPS[topology]
    return {
        # decoding with an adapter beside a base request
        "lora_decoding": [A.Start(8, 0, NEW_TOKENS, lora="lora0"), A.Start(64, 1, NEW_TOKENS), A.Steps(decode)],
        # three adapters for two slots: the third adapter's request waits for a slot
        "lora_third_waits": [A.Start(8, 0, NEW_TOKENS, lora="lora0"), A.Start(8, 1, NEW_TOKENS, lora="lora1"),
                             A.Start(65, 2, NEW_TOKENS, lora="lora2"), A.Steps(2)],
    }


# LoRA's own operations (grammar 8), applied in every phase of a LoRA topology.
LORA_OPERATIONS: Dict[str, List[A.Action]] = {
    # an unload posted while its adapter's request runs: it must wait for the request
    "lora_unload_in_use": [A.LoraOp("unload", "lora0"), A.Steps(2), A.Start(8, 2, NEW_TOKENS, lora="lora0")],
    # a new adapter loaded mid-run and used at once
    "lora_load_and_use": [A.LoraOp("load", "lora1"), A.Start(64, 1, NEW_TOKENS, lora="lora1")],
    # the same from its tensors (load_lora_adapter_from_tensors, grammar 11)
    "lora_load_tensors_and_use": [A.LoraOp("load_tensors", "lora1"), A.Start(64, 1, NEW_TOKENS, lora="lora1")],
    # adapters rotating through the two slots: an evicted one comes back
    "lora_rotate": [A.Start(129, 0, NEW_TOKENS, lora="lora2"), A.Steps(3), A.Start(65, 1, NEW_TOKENS, lora="lora1"),
                    A.Steps(3), A.Start(8, 2, NEW_TOKENS, lora="lora0"), A.LoraOp("unload", "lora2")],
}


def priority_phases(topology: str) -> Dict[str, List[A.Action]]:
    """Phases of a priority topology's full running slots (three at most)."""
    decode = DECODE_STEPS[topology]
    return {
        # three priority-0 requests decoding: the running slots are full
        "priority_slots_full": [A.Start(8, 0, NEW_TOKENS, priority=0), A.Start(64, 1, NEW_TOKENS, priority=0),
                                A.Start(100, 2, NEW_TOKENS, priority=0), A.Steps(decode)],
        # three without a priority (SGLang's worst) decoding, one of them still chunking a long prompt
        "unprioritized_slots_full": [A.Start(8, 0, NEW_TOKENS), A.Start(65, 1, NEW_TOKENS),
                                     A.Start(192, 2, NEW_TOKENS), A.Steps(2)],
    }


# Priority's own request shapes (grammar 12), applied in every phase of a priority topology.
PRIORITY_OPERATIONS: Dict[str, List[A.Action]] = {
    # better by more than the threshold: preempts a running request when the slots are full
    "priority_preempts": [A.Start(63, 0, NEW_TOKENS, priority=20), A.Steps(3)],
    # better by less than the threshold: waits for a slot; then one that preempts passes it
    "priority_waits_then_preempts": [A.Start(8, 1, NEW_TOKENS, priority=5), A.Steps(2),
                                     A.Start(127, 2, NEW_TOKENS, priority=20), A.Steps(2)],
}


def programs(topology: str, features: Tuple[str, ...] = ()) -> List[Tuple[str, List[A.Action]]]:
    """``(name, program)`` for every phase x operation sequence (with
    HiCache's phases when ``features`` has "hicache"). With "lora": the
    LoRA phases with every operation sequence, and every phase with LoRA's
    operations (the base phases with the base operations are the plain
    topology's corpus); with "priority" the same with priority's phases and
    request shapes."""
    grid = dict(phases(topology))
    if "hicache" in features:
        grid.update(hicache_phases(topology))
    if "priority" in features:  # as LoRA's: its phases x every sequence, every phase x its sequences
        priority_grid = priority_phases(topology)
        return ([(f"{phase}+{op}", prefix + ops) for phase, prefix in priority_grid.items()
                 for op, ops in {**operations(topology), **PRIORITY_OPERATIONS}.items()]
                + [(f"{phase}+{op}", prefix + ops) for phase, prefix in grid.items()
                   for op, ops in PRIORITY_OPERATIONS.items()])
    if "lora" in features:
        lora_grid = lora_phases(topology)
        return ([(f"{phase}+{op}", prefix + ops) for phase, prefix in lora_grid.items()
                 for op, ops in {**operations(topology), **LORA_OPERATIONS}.items()]
                + [(f"{phase}+{op}", prefix + ops) for phase, prefix in grid.items()
                   for op, ops in LORA_OPERATIONS.items()])
    return [(f"{phase}+{op}", prefix + ops)
            for phase, prefix in grid.items()
            for op, ops in operations(topology).items()]
