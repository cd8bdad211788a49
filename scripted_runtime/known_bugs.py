"""Known SGLang bugs: the registry (one file, one entry per live upstream bug).

Each entry says how the harness sees the bug (a regular expression over the
failure signature, on the topologies and releases it affects), the scenario
that reproduces it, and the drafted upstream report under ``docs/upstream/``.

Used by:

* ``scripted-runtime explore``: a failure that matches an entry is reported
  as ``known: NAME`` and the search goes on looking for others
  (``--stop-at-known`` stops at it instead, ``--no-known-bugs`` treats it as
  a new finding, shrunk and written out like any other);
* ``tests/server/test_known_bugs.py``: every entry's scenario runs as a strict
  xfail on the topologies it affects, so the day SGLang fixes the bug the
  suite says so (XPASS fails it) and the entry can be retired.

An entry is a bug of SGLang, never of the harness: a failure of ours is
fixed, not registered. Matching is deliberately narrow (signature *and*
topology *and* release) so that a new bug with a similar signature on
another topology or release is still reported as new.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple


@dataclass(frozen=True)
class KnownBug:
    name: str
    title: str
    signature: str  # a regular expression, searched in the failure signature
    message: str  # a regular expression, searched in the failure's message (which rule of a check)
    topologies: Tuple[str, ...]
    releases: str  # a version specifier (PEP 440) of the affected SGLang releases
    verified_on: Tuple[str, ...]  # releases where the scenario was run and failed
    scenario: str  # PATH:FUNCTION, relative to the repository root
    report: str  # the drafted upstream report, relative to the repository root
    variants: Tuple[Dict[str, Any], ...] = ({},)  # keyword arguments the scenario is run with, one run each
    # its scenario leaves the server dead or unusable (the next reset dies): the
    # suite runs it after everything else and shuts that server down
    breaks_server: bool = False
    # topologies whose strict xfail runs in the slow lane only: a bug of one code path every
    # topology shares (a request's validation), whose fix one topology in the default lane
    # sees, and whose crash costs each topology a server start
    slow_topologies: Tuple[str, ...] = ()
    # control operations (name prefixes, as the program's control log names them:
    # "pause_generation(retract)", "abort" for abort(rid) and abort_all) the failing program
    # must have posted for this bug to be the cause. For an entry whose message cannot tell it
    # from a bug of another cause: a rule that matched any pool shortfall at pp4 took three
    # mutants' kills for this bug in the kill table (bench/README.md), and the two-slots rule
    # two mutants' slot_ownership kills
    needs_ops: Tuple[str, ...] = ()
    # (topology, another entry's name): where that registered bug fails this bug's scenario
    # first, so the scenario there must fail as that entry says (its strict xfail)
    masked_by: Tuple[Tuple[str, str], ...] = ()
    # the check this bug breaks on nearly every program that uses its operation, stopping each
    # there: where it applies, explore and mutate run with that check off (``waived_checks``,
    # ``--no-waive-known`` to keep it), so programs go on past it and can show other bugs. Its
    # strict xfail (tests/server/test_known_bugs.py) keeps checking it. Only for a bug that leaves
    # the server usable, whose check catches nothing else there that matters (docs/exploring.md)
    masks_check: str = ""
    # whether its strict xfail runs the scenario with the per-iteration invariants on. Off only
    # for a race that corrupts memory: whichever check reads the garbage first fails, so the
    # failure would not be one the entry can name (a crash is, with the checks off)
    scenario_invariants: bool = True
    # a built-in patch that works the bug around (``hooks/workarounds.py``: a candidate fix that
    # changes nothing a request computes): where the bug applies, explore and mutate start their
    # servers with it (``workarounds``, ``--no-waive-known`` to leave it out), so a race the search
    # keeps meeting does not end the programs that could show another bug. Only for a bug whose
    # every failure the search would otherwise stop at and restart after, with no check to waive
    workaround: str = ""

    def applies(self, topology: str, sglang_version: Optional[str]) -> bool:
        """Whether the bug is registered for this topology and release. A
        feature topology (pp1-lora, pp1-hicache) has its plain topology's
        bugs: the same loop with a feature added."""
        from scripted_runtime.user_side.engine_config import base_topology

        registered = topology in self.topologies or base_topology(topology) in self.topologies
        return registered and affects(self.releases, sglang_version)

    def matches(self, signature: Optional[str], *, topology: str, sglang_version: Optional[str],
                message: str = "", ops: Optional[Sequence[str]] = None) -> bool:
        """Whether a failure is this bug. ``ops``: the names of the control
        operations the failing program posted; an entry with ``needs_ops``
        matches only when each is among them. None: not known (a crash
        whose driver sent no control log, or one in the reset between two
        programs), and then the message rules alone decide, as for an entry
        without ``needs_ops``."""
        if not signature or not self.applies(topology, sglang_version):
            return False
        if self.needs_ops and ops is not None:
            posted = effective_ops(ops)
            if not all(any(op.startswith(need) for op in posted) for need in self.needs_ops):
                return False
        return (re.search(self.signature, signature) is not None
                and re.search(self.message, message or "") is not None)


def effective_ops(ops: Sequence[str]) -> List[str]:
    """The operations the scheduler was sent for ``ops`` (control-log names):
    ``pause_generation(abort)`` is also an ``abort_all`` (SGLang's tokenizer
    handles the abort mode by aborting every request, and never sends the
    pause on)."""
    out = list(ops)
    out += ["abort_all" for op in ops if op.startswith("pause_generation(abort)")]
    return out


def affects(specifier: str, version: Optional[str]) -> bool:
    """Whether ``version`` is in ``specifier``. An unknown version is never
    matched: a failure on a build of unknown release is reported as new."""
    if not version or version == "?":
        return False
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    try:
        return Version(version) in SpecifierSet(specifier)
    except InvalidVersion:
        return False


REGISTRY: Tuple[KnownBug, ...] = (
    KnownBug(
        name="pp_pause_ignored",
        title="event_loop_pp never checks _engine_paused: pause_generation is acknowledged and ignored under PP",
        signature=r"ContractViolation\[pause\]",
        # only the rule this bug breaks: a forward launched in a PP slot while
        # paused (another pause rule broken on pp4 is a new finding)
        message=r"forward of .* was launched at step \d+ \(PP slot \d+\), while paused",
        topologies=("pp4",),
        releases="<=0.5.23",
        verified_on=("0.5.23",),
        scenario="scenarios/known_bugs.py:pp_pause_ignored",
        report="docs/upstream/pp-pause-ignored.md",
        variants=({"mode": "in_place"}, {"mode": "retract"}),
        # 181 of 1,760 programs of a pp4 dev exploration (c5af699) stopped on it, every one that
        # paused while a request ran: whatever else they would have shown was never checked
        masks_check="pause",
    ),
    KnownBug(
        name="pp_release_while_paused_runs_waiting",
        title="release_memory_occupation while paused under PP: the PP loop, ignoring the pause (pp_pause_ignored), "
              "prefills the requests that waited at the release over the released KV cache and weights",
        signature=r"ContractViolation\[memory_occupation\]",
        # only a forward over released memory (another memory_occupation rule broken on pp4 is a new finding)
        message=r"forward of .* was launched at step \d+ while .*memory was released",
        topologies=("pp4",),
        releases="<=0.5.23",
        verified_on=("0.5.23",),
        scenario="scenarios/known_bugs.py:pp_release_while_paused_runs_waiting",
        report="docs/upstream/pp-pause-ignored.md",
        # the RL cycle is cut after its release lost the weights (on CPU the harness overwrites
        # them, as a GPU loses them) and before an update loaded them: the next reset refuses the
        # engine ("weights lost to a release and not loaded again")
        breaks_server=True,
    ),
    KnownBug(
        name="pp_retract_chunk_double_release",
        title="pause_generation(retract) under PP retracts a request whose last chunk is in flight in another "
              "slot; two slots finish it, its KV is released twice and the scheduler dies in release_kv_cache",
        signature=r"SchedulerCrashed: AssertionError: Only a mamba-capable tree cache allows freeing before alloc",
        message=r"",
        topologies=("pp4",),
        releases="<=0.5.23",
        verified_on=("0.5.23",),
        scenario="scenarios/known_bugs.py:pp_retract_chunk_double_release",
        report="docs/upstream/pp-retract-chunk-double-release.md",
        # its cause: a retract (a crash report carries the control log; the assertion also
        # fires for any double release, e.g. a request pruned twice: mut_prune_keeps_aborted)
        needs_ops=("pause_generation(retract)",),
        breaks_server=True,
    ),
    KnownBug(
        name="pp_retract_chunk_duplicate_token",
        title="the same retract under PP: a chunk result computed before the retract is processed after it "
              "(its last chunk's result committed, or a middle chunk's taking the recompute's in-flight count): "
              "a non-final chunk's prediction becomes the output (with context-free weights a duplicated token)",
        signature=r"OutputMismatch",
        # of a request prefilled in chunks (only such a request has a non-final chunk; the oracle
        # names it): a token that repeats the one before it, where the reference goes on (what the
        # context-free dummy weights, the GPU default, show: a chunk's prediction equals the full
        # prompt's), or a first token that is a non-final chunk's prediction (what the
        # context-sensitive weights show: the committed token is the one the prompt's first chunk
        # predicts). Without "prefilled in chunks" a repeated token is another fault (a
        # re-prefill of the prompt alone after a retraction repeats its first token too).
        message=(r"prefilled in chunks, finished\): token \d+ is (\d+), the reference has \d+ "
                 r"\(output \[(?:\d+, )*\1, \1[,\]]"
                 r"|prefilled in chunks, (?:finished|aborted)\): .*token 0 is \d+, .*a non-final chunk's token"),
        topologies=("pp4",),
        releases="<=0.5.23",
        verified_on=("0.5.23",),
        scenario="scenarios/known_bugs.py:pp_retract_chunk_duplicate_token",
        report="docs/upstream/pp-retract-chunk-double-release.md",
        variants=({}, {"middle_chunk": True}),
    ),
    KnownBug(
        name="pp_retract_chunk_abort_dropped",
        title="the same retract under PP, then an abort: the retracted request is dropped from the waiting queue "
              "without a finish reason while its chunk is still in flight in another slot",
        signature=r"ContractViolation\[abort\]",
        message=r"vanished from the scheduler without a finish reason; it was running when the abort came",
        topologies=("pp4",),
        releases="<=0.5.23",
        verified_on=("0.5.23",),
        scenario="scenarios/known_bugs.py:pp_retract_chunk_abort_dropped",
        report="docs/upstream/pp-retract-chunk-double-release.md",
        needs_ops=("pause_generation(retract)", "abort"),  # its cause: a retract, then an abort
    ),
    KnownBug(
        name="pp_retract_abort_stale_last_mbs",
        title="the same retract under PP, then an abort: the pause clears last_batch but not last_mbs, which still "
              "holds the dropped request; is_fully_idle() says idle while it is held (the next reset dies)",
        signature=r"InvariantViolation\[idle_gate\]",
        # only a live request held by a last_mbs slot alone: the pause's stale leftover
        message=r"says idle but \d+ live request\(s\) are held: \S+ in last_mbs\[\d+\] \(",
        topologies=("pp4",),
        releases="<=0.5.23",
        verified_on=("0.5.23",),
        scenario="scenarios/known_bugs.py:pp_retract_abort_stale_last_mbs",
        report="docs/upstream/pp-retract-chunk-double-release.md",
        needs_ops=("pause_generation(retract)", "abort"),  # its cause: a retract, then an abort
        breaks_server=True,
        # one cause with the entries above, whose strict xfails run in the default lane; each of
        # these leaves its pp4 server unusable (a 36 s restart)
        slow_topologies=("pp4",),
    ),
    KnownBug(
        name="pp_retract_abort_adopted_decode_leak",
        title="the same retract under PP, then an abort: the stale last chunk is adopted as a decode for the "
              "dropped request and allocates KV no one holds (the pools are one token short; the next reset dies)",
        # the pools' sum is short of the total (a KV slot allocated for a request held nowhere), or,
        # unchecked, what follows: release_kv_cache's KV-state assert kills the scheduler a few
        # iterations later. The second is what an exploration meets when another check stopped the
        # program right after the retract and the harness's reset posted the abort (abort_all): the
        # reset's operations are judged with the program's (pp4 dev run, seed 575170279, 1,630)
        signature=r"InvariantViolation\[pool_accounting\]|SchedulerCrashed: AssertionError in release_kv_cache \(",
        message=(r"available \d+ \+ evictable \d+ \+ protected \d+ \+ uncached \d+ = \d+ != total \d+"
                 r"|AssertionError in release_kv_cache \("),
        topologies=("pp4",),
        releases="<=0.5.23",
        verified_on=("0.5.23",),
        scenario="scenarios/known_bugs.py:pp_retract_abort_adopted_decode_leak",
        report="docs/upstream/pp-retract-chunk-double-release.md",
        needs_ops=("pause_generation(retract)", "abort"),  # its cause: a retract, then an abort
        breaks_server=True,
        # one cause with the entries above, whose strict xfails run in the default lane; each of
        # these leaves its pp4 server unusable (a 36 s restart)
        slow_topologies=("pp4",),
    ),
    KnownBug(
        name="pp_retract_chunk_two_slots",
        title="the same retract under PP, seen before the crash: the chunked request is held by two slots' "
              "batches (recompute and adopted decode) and decodes on KV that is on the free list",
        # a live request's KV on the free list while two PP slots' batches hold it; run
        # alone on a fresh server the same program reaches the double release first
        signature=r"InvariantViolation\[slot_ownership\]|SchedulerCrashed: AssertionError: Only a mamba-capable",
        message=(r"KV indices .* of live request \S+ \(row \d+\) are in the allocator's free list .*"
                 r"owners: \S+: row \d+ in \S*mbs\[\d+\]\S*mbs\[\d+\]|Only a mamba-capable tree cache"),
        topologies=("pp4",),
        releases="<=0.5.23",
        verified_on=("0.5.23",),
        scenario="scenarios/known_bugs.py:pp_retract_chunk_two_slots",
        report="docs/upstream/pp-retract-chunk-double-release.md",
        needs_ops=("pause_generation(retract)",),  # its cause: a retract
        breaks_server=True,
    ),
    KnownBug(
        name="pp_retract_chunk_input_logprobs_crash",
        title="the same retract under PP, for a request that asked for input logprobs: the chunk in flight's "
              "result is processed for the retracted request, its input logprobs no longer add up and the "
              "result processor's assert kills the scheduler",
        # the assert logprob_start_len_negative also trips: told apart by its cause, a retract
        # (that entry's scenario posts no control operation); listed first so a retract takes it
        signature=r"SchedulerCrashed: AssertionError in add_input_logprob_return_values",
        message=r"",
        topologies=("pp4",),
        releases="<=0.5.23",
        verified_on=("0.5.23",),
        scenario="scenarios/known_bugs.py:pp_retract_chunk_input_logprobs_crash",
        report="docs/upstream/pp-retract-chunk-double-release.md",
        needs_ops=("pause_generation(retract)",),  # its cause: a retract
        breaks_server=True,
    ),
    KnownBug(
        name="prompt_token_out_of_vocab",
        title="a /generate prompt with a token id past the vocabulary is not validated and kills the scheduler "
              "in the embedding lookup (one request takes the server down)",
        signature=r"SchedulerCrashed: IndexError: index out of range in self",
        message=r"",
        topologies=("pp1-overlap", "pp1-normal", "pp4"),
        releases="<=0.5.23",
        verified_on=("0.5.23",),
        scenario="scenarios/known_bugs.py:prompt_token_out_of_vocab",
        report="docs/upstream/prompt-token-out-of-vocab.md",
        breaks_server=True,
        slow_topologies=("pp1-normal", "pp4"),
    ),
    KnownBug(
        name="top_logprobs_num_past_vocab",
        title="a /generate request with return_logprob and top_logprobs_num past the vocabulary is not "
              "validated and kills the scheduler in the logits processor's topk (one request takes the server "
              "down)",
        signature=r"SchedulerCrashed: RuntimeError: selected index k out of range",
        message=r"",
        topologies=("pp1-overlap", "pp1-normal", "pp4"),
        releases="<=0.5.23",
        verified_on=("0.5.23",),
        scenario="scenarios/known_bugs.py:top_logprobs_num_past_vocab",
        report="docs/upstream/top-logprobs-num-past-vocab.md",
        breaks_server=True,
        slow_topologies=("pp1-normal", "pp4"),
    ),
    KnownBug(
        name="logprob_start_len_negative",
        title="a /generate request with return_logprob and a logprob_start_len below -1 is not refused; the "
              "result processor counts the prompt positions from the end (a negative slice) and its assert "
              "kills the scheduler (one request takes the server down)",
        signature=r"SchedulerCrashed: AssertionError in add_input_logprob_return_values",
        message=r"",
        topologies=("pp1-overlap", "pp1-normal", "pp4"),
        releases="<=0.5.23",
        verified_on=("0.5.23",),
        scenario="scenarios/known_bugs.py:logprob_start_len_negative",
        report="docs/upstream/logprob-start-len-negative.md",
        breaks_server=True,
        slow_topologies=("pp1-normal", "pp4"),
    ),
    KnownBug(
        name="expert_distribution_route_without_recorder",
        title="/start_expert_distribution_record (and stop, dump) on a server started without "
              "--expert-distribution-recorder-mode raises in the scheduler and kills it (one GET takes the server "
              "down)",
        signature=r"SchedulerCrashed: Exception: Please set ServerArgs.expert_distribution_recorder_mode",
        message=r"",
        topologies=("pp1-overlap", "pp1-normal", "pp4"),
        releases="<=0.5.23",
        verified_on=("0.5.23",),
        scenario="scenarios/known_bugs.py:expert_distribution_route_without_recorder",
        report="docs/upstream/expert-distribution-route-without-recorder.md",
        breaks_server=True,
        slow_topologies=("pp1-normal", "pp4"),
    ),
    KnownBug(
        name="release_memory_syncs_build_device",
        title="release_memory_occupation synchronizes torch's build accelerator, not the served device: on a CPU "
              "server with a CUDA build of torch it calls torch.cuda.synchronize() and the scheduler dies",
        signature=r"SchedulerCrashed: RuntimeError: (Found no NVIDIA driver|Cannot re-initialize CUDA)",
        message=r"",
        topologies=("pp1-overlap", "pp1-normal", "pp4"),
        releases="<=0.5.23",
        verified_on=("0.5.23",),
        scenario="scenarios/known_bugs.py:release_memory_syncs_build_device",
        report="docs/upstream/release-memory-syncs-build-device.md",
        breaks_server=True,
        slow_topologies=("pp1-normal", "pp4"),
        needs_ops=("release_memory_occupation",),
    ),
    KnownBug(
        name="resume_memory_not_released",
        title="resume_memory_occupation of a tag that is not released (a repeated or retried resume) raises KeyError "
              "in offload_tags.remove and kills the scheduler",
        signature=r"SchedulerCrashed: KeyError: '(kv_cache|weights|cuda_graph)'",
        message=r"",
        topologies=("pp1-overlap", "pp1-normal", "pp4"),
        releases="<=0.5.23",
        verified_on=("0.5.23",),
        scenario="scenarios/known_bugs.py:resume_memory_not_released",
        report="docs/upstream/resume-memory-not-released.md",
        breaks_server=True,
        # the default lane's budget: a crash and a restart per topology; the slow lane runs all three
        slow_topologies=("pp1-overlap", "pp1-normal", "pp4"),
    ),
    KnownBug(
        name="send_weights_without_send_group",
        title="/send_weights_to_remote_instance before /init_weights_send_group_for_remote_instance (or for a "
              "group name never initialized) raises KeyError on the plain dict of send groups and kills the "
              "scheduler, where the handler meant to refuse",
        # the signature writes digits as N: the key is f"{group_name}_{port}_{tp_rank}"
        signature=r"SchedulerCrashed: KeyError: '.*_N_N'",
        message=r"",
        topologies=("pp1-overlap", "pp1-normal", "pp4"),
        releases="<=0.5.23",
        verified_on=("0.5.23",),
        scenario="scenarios/known_bugs.py:send_weights_without_send_group",
        report="docs/upstream/send-weights-without-send-group.md",
        breaks_server=True,
        # a crash and a restart per topology: the default lane runs pp1-overlap
        slow_topologies=("pp1-normal", "pp4"),
    ),
    KnownBug(
        name="profile_start_while_running_accepted",
        title="/start_profile while a profile runs answers success and starts a second torch profiler over the "
              "first (the handler's 'already in progress' refusal is discarded): the first profile is never "
              "stopped and its trace is lost",
        signature=r"ContractViolation\[diagnostics\]",
        message=r"start_profile answered success while a profile was running",
        topologies=("pp1-overlap", "pp1-normal", "pp4"),
        releases="<=0.5.23",
        verified_on=("0.5.23",),
        scenario="scenarios/known_bugs.py:profile_start_while_running_accepted",
        report="docs/upstream/profile-start-while-running-accepted.md",
        # one code path on every topology (the profiler manager's start): pp1-overlap in the default lane
        slow_topologies=("pp1-normal", "pp4"),
    ),
    KnownBug(
        name="input_logprob_last_vocab_id_zeroed",
        title="a return_logprob request's input_token_logprobs name token 0 for every prompt token equal to the last "
              "id of the vocabulary (vocab_size - 1): the result processor's clip of multimodal pad hashes tests "
              "x < vocab_size - 1, so it also rewrites that real token",
        signature=r"LogprobContractError",
        message=r"input logprobs name",
        topologies=("pp1-overlap", "pp1-normal", "pp4"),
        releases="<=0.5.23",
        verified_on=("0.5.23",),
        scenario="scenarios/known_bugs.py:input_logprob_last_vocab_id_zeroed",
        report="docs/upstream/input-logprob-last-vocab-id-zeroed.md",
        # one code path on every topology (the logprob result processor): pp1-overlap in the default lane
        slow_topologies=("pp1-normal", "pp4"),
    ),
    KnownBug(
        name="prefill_only_abort_reports_dummy_token",
        title="a prefill-only request (max_new_tokens=0) aborted while its prefill is in flight answers with one "
              "output token, the dummy 0 the worker puts in place of sampling: the abort's finish skips the "
              "length rule that cuts it",
        # the output oracle sees it; where the oracle does not compare the request (its life spans a
        # weight update), the request contract's length rule does. The token is the dummy 0 when the
        # whole batch is prefill-only, a sampled one when the batch holds requests that sample
        # (met on grammar 17's derandomized pp1-overlap draw: output_ids=[210], a 65-token prompt
        # prefilled beside an 8-token request of one new token)
        signature=r"OutputMismatch|RequestContractError",
        message=(r"aborted after \d+ tokens, past the end of its reference after 0 \(max_new_tokens=0\)"
                 r"|: 1 tokens for max_new_tokens=0 \(output_ids=\[\d+\], finish_reason=\{'type': 'abort'"),
        # the normal loop processes a prefill's result in the iteration that launched it: no abort between
        topologies=("pp1-overlap", "pp4"),
        releases="<=0.5.23",
        verified_on=("0.5.23",),
        scenario="scenarios/known_bugs.py:prefill_only_abort_reports_dummy_token",
        report="docs/upstream/prefill-only-abort-reports-dummy-token.md",
        needs_ops=("abort",),
    ),
    KnownBug(
        name="disk_update_rollback_reloads_failed_checkpoint",
        title="update_weights_from_disk of a checkpoint that does not fit the model kills the scheduler: the "
              "rollback rebuilds the weights iterator from model_config, whose model_path already names the "
              "checkpoint that failed, so it fails again inside the except",
        # the weight loader's shape assertion, raised again by the rollback (the scenario's checkpoint
        # has a cut embedding: the vocab-parallel embedding's own assertion)
        signature=r"SchedulerCrashed: AssertionError: (Attempted to load weight|self\.org_vocab_size=)",
        message=r"",
        topologies=("pp1-overlap", "pp1-normal", "pp4"),
        releases="<=0.5.23",
        verified_on=("0.5.23",),
        scenario="scenarios/known_bugs.py:disk_update_rollback_reloads_the_failed_checkpoint",
        report="docs/upstream/disk-update-rollback-reloads-failed-checkpoint.md",
        breaks_server=True,
        slow_topologies=("pp1-normal", "pp4"),
        needs_ops=("update_weights_from_disk",),
    ),
    KnownBug(
        name="pp_profiler_stop_with_sends_in_flight",
        title="under PP the torch profiler stops while the loop's asynchronous gloo sends are in flight; torch "
              "finishes their profiling records on gloo's worker thread after the profiler is gone, and memory "
              "is corrupted: a rank dies of a segmentation fault, or a forward or the harness reads garbage",
        # what the corruption has shown (2026-11-28, profiler_stress.py and two dev explorations): a
        # rank's segmentation fault, which its peers report as gloo's closed connection; a KV index
        # of 14 digits; the harness's scan reading a length of hundreds of TiB. A rank that dies
        # without a Python traceback sends no crash report, so its peers' gloo error is the failure
        # (the gloo form's signature is cut at 100 characters, inside the message with a longer
        # build path than torch's wheels carry: the message rule tells the forms apart)
        signature=(r"SchedulerCrashed: (RuntimeError: \[\S*gloo|IndexError: index N is out of bounds)"
                   r"|HarnessError: the step observer raised MemoryError"),
        message=r"Connection (closed|reset) by peer|index \d{10,} is out of bounds|Unable to allocate [\d.]+ [TPE]iB",
        topologies=("pp4",),
        releases="<=0.5.23",
        verified_on=("0.5.23",),
        scenario="scenarios/known_bugs.py:pp_profiler_stop_with_sends_in_flight",
        report="docs/upstream/pp-profiler-stop-with-sends-in-flight.md",
        breaks_server=True,
        # a race: its scenario runs up to 100 profiled rounds (about a minute at pp4 when it does
        # not crash): the slow lane on every topology
        slow_topologies=("pp1-overlap", "pp1-normal", "pp4"),
        needs_ops=("start_profile",),
        # with every check on, a run failed on slot_ownership (KV of a live request in the free
        # list): the corruption read by a check; with them off, 3 runs of 3 crashed as registered
        scenario_invariants=False,
        # the pp4 kill table's derandomized program 9 crashed here in nearly every row (bbab9d9),
        # costing each row a restart and 10-20 programs, and four rows' kills at e0c3caa
        workaround="fence_pp_profiler_stop",
    ),
    KnownBug(
        name="abort_pause_during_in_place_pause",
        title="pause_generation(abort) while an in_place pause holds a running request never returns (the request "
              "cannot finish while paused) and holds the tokenizer's pause lock, so continue_generation can never "
              "be sent: the server stays paused for good",
        signature=r"PauseAnswerTimeout: pause_generation",
        message=r"pause_generation\(abort\) got no HTTP answer",
        # under PP the scheduler ignores the in_place pause (pp_pause_ignored), so the request ends
        topologies=("pp1-overlap", "pp1-normal"),
        releases="<=0.5.23",
        verified_on=("0.5.23",),
        scenario="scenarios/known_bugs.py:abort_pause_during_in_place_pause",
        report="docs/upstream/abort-pause-during-in-place-pause.md",
        breaks_server=True,
        slow_topologies=("pp1-normal", "pp4"),
        needs_ops=("pause_generation(in_place)", "pause_generation(abort)"),
        masked_by=(("pp4", "pp_pause_ignored"),),
    ),
)


def find(signature: Optional[str], *, topology: str, sglang_version: Optional[str], message: str = "",
         ops: Optional[Sequence[str]] = None, registry: Sequence[KnownBug] = REGISTRY,
         own_failure: Optional[Tuple[str, str]] = None) -> Optional[KnownBug]:
    """The registered bug this failure is, or None (a new finding).

    ``own_failure``: (signature, message) of a program's own failure when
    the scheduler then died in the engine reset after it and that crash
    became the failure. A registered bug that breaks the server
    (``breaks_server``: its entry says the next reset dies) matched by the
    program's own failure explains the crash after it too, and is looked
    up first: it names the crash's cause more precisely than an entry the
    crash alone matches."""
    if own_failure is not None:
        own_signature, own_message = own_failure
        for bug in registry:
            if bug.breaks_server and bug.matches(own_signature, topology=topology, sglang_version=sglang_version,
                                                 message=own_message, ops=ops):
                return bug
    for bug in registry:
        if bug.matches(signature, topology=topology, sglang_version=sglang_version, message=message, ops=ops):
            return bug
    return None


def waived_checks(registry: Sequence[KnownBug], *, topology: str, sglang_version: Optional[str],
                  checks: Any = True) -> Dict[str, str]:
    """{check: the bug's name} of the registered bugs on ``topology`` and
    ``sglang_version`` whose check (``masks_check``) an exploration turns
    off there, among ``checks`` (True: all, False: none, or the names a run
    checks)."""
    if checks is False:
        return {}
    out: Dict[str, str] = {}
    for bug in registry:
        if bug.masks_check and bug.applies(topology, sglang_version) and (checks is True or bug.masks_check in checks):
            out.setdefault(bug.masks_check, bug.name)
    return out


def workarounds(registry: Sequence[KnownBug], *, topology: str, sglang_version: Optional[str]) -> Dict[str, str]:
    """{patch: the bug's name} of the registered bugs on ``topology`` and
    ``sglang_version`` that name a workaround (``KnownBug.workaround``), in
    registry order."""
    out: Dict[str, str] = {}
    for bug in registry:
        if bug.workaround and bug.applies(topology, sglang_version):
            out.setdefault(bug.workaround, bug.name)
    return out


def by_name(name: str) -> KnownBug:
    for bug in REGISTRY:
        if bug.name == name:
            return bug
    raise KeyError(f"no known bug {name!r}; registered: {', '.join(b.name for b in REGISTRY)}")
