"""Hypothesis strategies for explored programs (harness process).

A program is a list of actions (``actions.py``). Alternatives are listed
simplest first, because Hypothesis shrinks towards the first: a failing
program shrinks towards fewer actions, plain steps, short prompts, few new
tokens.
"""
from __future__ import annotations

from typing import Optional, Tuple

from hypothesis import strategies as st

from scripted_runtime import extensions
from scripted_runtime.scheduler_side import request_fuzz, windows
from scripted_runtime.scheduler_side.explore import prompts
from scripted_runtime.user_side import engine_config
from scripted_runtime.user_side.explore import actions as A

# Prompt lengths around the 64-token chunk boundaries (1, 2 and 3 chunks): the grammar's own.
PROMPT_LENGTHS = A.PROMPT_LENGTHS
# With HiCache on (pp1-hicache's 400-token device pool, 481-slot host pool) long prompts,
# so that three prefixes overflow the device pool (evicting to the host) and the host pool.
HICACHE_PROMPT_LENGTHS = (64, 128, 150, 192)
# Requests of one prompt family share their prompt prefix in the radix tree; family 0 first.
PROMPT_FAMILIES = tuple(range(prompts.FAMILIES))
MAX_NEW_TOKENS = 12
MAX_ACTIONS = 12
# How many earlier requests a Resend picks among, and how far up the length ladder it may go.
RESEND_PICKS = 4
RESEND_LONGER = 3
# Pages an ExhaustKv leaves free: none (nothing new is admitted; a decode batch retracts down
# to one request, which is then aborted), a few decode steps' worth, about one 64-token chunk,
# and room for one long prompt (the radix tree is evicted to make room). The CPU default's
# page is one token and its pool 8192 (pp1-hicache's 400).
KV_LEAVE_PAGES = (0, 4, 64, 200)

LOOP_OF_TOPOLOGY = {"pp1-overlap": "overlap", "pp1-normal": "normal", "pp4": "pp", "pp1-hicache": "normal",
                    "pp1-lora": "overlap", "pp1-priority": "overlap"}
# Steps "when window W opens" waits for it, per topology (PP steps are microbatch slots).
WINDOW_WAIT_STEPS = {"pp1-overlap": 24, "pp1-normal": 24, "pp4": 60, "pp1-hicache": 24, "pp1-lora": 24,
                     "pp1-priority": 24}
MAX_STEPS_ACTION = {"pp1-overlap": 8, "pp1-normal": 8, "pp4": 12, "pp1-hicache": 8, "pp1-lora": 8,
                    "pp1-priority": 8}


def windows_for(topology: str, features: Optional[Tuple[str, ...]] = None) -> Tuple[str, ...]:
    """The windows that can open on ``topology``; one that needs an engine
    feature (HiCache's) only when ``features`` (by default the topology's
    own, ``engine_config.features_of``) has it."""
    if features is None:
        features = engine_config.features_of(topology)
    loop = LOOP_OF_TOPOLOGY[topology]
    return tuple(name for name, w in windows.WINDOWS.items()
                 if loop in w.loops and (not w.needs or w.needs in features))


# The coverage table's phases an OnPhase waits for, per loop: not ``idle`` (a program is there
# before its first request arrives) nor ``paused`` (only a pause the program posts makes it).
TARGET_PHASES = {"normal": ("decode", "queued", "prefill_chunk", "finished_unpruned"),
                 "overlap": ("decode", "queued", "prefill_chunk", "finished_unpruned"),
                 "pp": ("decode", "queued", "prefill_chunk", "finished_unpruned", "pp_in_flight")}


# What ReleaseMemory and RlCycle release: everything (SGLang's default), or one of the two
# tags whose loss the harness emulates on CPU (cuda_graph alone changes nothing here).
MEMORY_TAG_CHOICES = ("all", "kv_cache", "weights")
PAUSE_MODES = ("in_place", "retract", "abort")
RL_CYCLE_GAPS = (0, 1, 3)


def rl_cycles() -> st.SearchStrategy:
    return st.builds(A.RlCycle, pause_mode=st.sampled_from(("retract", "in_place", "abort")),
                     tags=st.sampled_from(MEMORY_TAG_CHOICES), gap=st.sampled_from(RL_CYCLE_GAPS),
                     distributed=st.booleans())


# The runtime knobs and weight queries (grammar 7): limits SGLang accepts first, then refused ones.
LIMIT_VALUES = ("1", "2", "default", "zero", "above")
SLOW_DOWN_MS = (1, 0)
WEIGHT_QUERIES = ("checksum", "snapshot", "compare", "get_weights", "version", "server_info", "freeze_gc",
                  "log_level", "profile", "profile_stop")


SESSION_OPS = ("open", "close", "reopen")


def runtime_ops() -> st.SearchStrategy:
    return st.one_of(st.builds(A.SetLimit, value=st.sampled_from(LIMIT_VALUES)),
                     st.builds(A.WeightQuery, kind=st.sampled_from(WEIGHT_QUERIES)),
                     st.builds(A.SlowDown, ms=st.sampled_from(SLOW_DOWN_MS)),
                     st.builds(A.SessionOp, kind=st.sampled_from(SESSION_OPS)))


def control_ops() -> st.SearchStrategy:
    return st.one_of(
        st.just(A.Flush()),
        st.builds(A.AbortOne, pick=st.integers(0, 3)),
        st.just(A.AbortAll()),
        st.builds(A.UpdateWeights, flush=st.booleans(), tensor=st.booleans()),
        st.builds(A.UpdateWeights, flush=st.booleans(), distributed=st.just(True)),
        st.builds(A.Pause, mode=st.sampled_from(PAUSE_MODES)),
        st.just(A.Continue()),
        st.builds(A.ReleaseMemory, tags=st.sampled_from(MEMORY_TAG_CHOICES)),
        st.just(A.ResumeMemory()),
        rl_cycles(),
        runtime_ops(),
    )


def _placed(op: A.Action) -> bool:
    """Ops an OnWindow / OnPhase may place: not those that only undo an
    earlier op of the program (continue, resume)."""
    return not isinstance(op, (A.Continue, A.ResumeMemory))


# A request's logprobs (Start.logprob_start): none (first, and three times in seven), output
# logprobs only (-1), or input logprobs from the first token, inside the first chunk, or inside
# the second (70, clamped into a shorter prompt). A start below a cached prefix caps the prefix
# match there (SGLang's Req.init_next_round_input), so a Resend with one also recomputes.
LOGPROB_STARTS = (None, None, None, -1, 0, 32, 70)


def _request_semantics() -> dict:
    """A request's drawn end: ignore_eos (True, the simpler, first), and
    no stop token (first) or the k-th token of its reference output;
    whether its answer is streamed (not first); whether it asks for
    logprobs, and from where (``LOGPROB_STARTS``)."""
    return {"max_new_tokens": st.integers(1, MAX_NEW_TOKENS),
            "ignore_eos": st.sampled_from((True, False)),
            "stop_at": st.one_of(st.none(), st.integers(0, MAX_NEW_TOKENS - 1)),
            "stream": st.booleans(),
            "logprob_start": st.sampled_from(LOGPROB_STARTS)}


# Under PP, which live request's micro-batch a Start may join (Start.beside): none (first), or
# one of the first few. At pp=1 there is one running batch, so it is not drawn there.
BESIDE_PICKS = 3


def priority_starts() -> st.SearchStrategy:
    """A request with a priority of ``A.PRIORITIES`` (a priority-scheduling
    topology): three running slots fill, a better one preempts or waits."""
    return st.builds(A.Start, prompt_len=st.sampled_from(PROMPT_LENGTHS), family=st.sampled_from(PROMPT_FAMILIES),
                     priority=st.sampled_from(A.PRIORITIES), **_request_semantics())


def starts(lengths=PROMPT_LENGTHS, *, pipeline: bool = False) -> st.SearchStrategy:
    """A request; under PP (``pipeline``) it may wait for the micro-batch
    slot of a live request first: a request admitted into a micro-batch that
    is decoding others (its prefill merged into their running batch) needs
    its arrival to line up with that slot, one turn in ``pp_loop_size``
    (6 at pp=4) when started after a random number of steps."""
    extra = {"beside": st.one_of(st.none(), st.integers(0, BESIDE_PICKS - 1))} if pipeline else {}
    return st.builds(A.Start, prompt_len=st.sampled_from(lengths), family=st.sampled_from(PROMPT_FAMILIES),
                     **_request_semantics(), **extra)


def lora_starts() -> st.SearchStrategy:
    """A request served with one of the harness's LoRA adapters (a LoRA
    topology), on a prompt whose references the oracle has per adapter."""
    return st.builds(A.Start, prompt_len=st.sampled_from(A.LORA_PROMPT_LENGTHS),
                     family=st.sampled_from(PROMPT_FAMILIES), lora=st.sampled_from(A.LORA_ADAPTERS),
                     **_request_semantics())


def lora_ops() -> st.SearchStrategy:
    return st.builds(A.LoraOp, kind=st.sampled_from(("unload", "load", "load_tensors")),
                     adapter=st.sampled_from(A.LORA_ADAPTERS))


def resends() -> st.SearchStrategy:
    """A request on an earlier request's prompt (a full hit) or that prompt
    made longer (a partial hit)."""
    return st.builds(A.Resend, pick=st.integers(0, RESEND_PICKS - 1), longer=st.integers(0, RESEND_LONGER),
                     **_request_semantics())


def turns() -> st.SearchStrategy:
    """A session turn (grammar 13): one continuing an earlier turn of the
    program (a conversation's first where there is none) once it ended, or
    at once (``eager``: it may still run), its session open or closed by a
    ``SessionOp``; or a new conversation's first turn (``after=None``).
    Drawn twice as often as a start: a turn continues another only after
    one (measured over 500 derandomized pp1-normal programs: 37 hold a turn
    continuing an earlier one, 10 with turns drawn once)."""
    return st.builds(A.Turn, after=st.one_of(st.integers(0, A.TURN_PICKS - 1), st.none()),
                     family=st.sampled_from(PROMPT_FAMILIES), input_len=st.sampled_from(A.TURN_INPUT_LENGTHS),
                     max_new_tokens=st.integers(1, MAX_NEW_TOKENS), stream=st.booleans(), eager=st.booleans())


def kv_pressure_actions() -> st.SearchStrategy:
    return st.one_of(st.builds(A.ExhaustKv, leave_pages=st.sampled_from(KV_LEAVE_PAGES), evict_cache=st.booleans()),
                     st.just(A.ReleaseKv()))


def kv_pressure_drawn(topology: str) -> bool:
    """KV pressure is drawn on every topology. Under PP every rank schedules
    on its own KV pool, so the harness takes the same room on each: its
    KV operations ride SGLang's request relay to every rank
    (``scheduler_side/rank_ops.py``), or the ranks would disagree about what
    fits (a harness artefact, not a bug)."""
    return topology in LOOP_OF_TOPOLOGY


def phase_ops(topology: str) -> st.SearchStrategy:
    """What an OnPhase does once its phase holds: a control operation (not
    continue: there is nothing to continue unless the program paused), or
    taking the free KV (memory running out mid-decode)."""
    ops = control_ops().filter(_placed)
    if not kv_pressure_drawn(topology):
        return ops
    return st.one_of(ops, st.builds(A.ExhaustKv, leave_pages=st.sampled_from(KV_LEAVE_PAGES),
                                    evict_cache=st.booleans()))


# A fuzzed request's base: short prompts (the cases make the long ones), a few new tokens.
FUZZ_PROMPT_LENGTHS = (8, 1, 63, 64, 65)
FUZZ_MAX_NEW_TOKENS = 8
FUZZ_MAX_CASES = 3


def _fields_key(case: str) -> str:
    # One case per field (its own or one it sets with it: a later one would override it).
    return request_fuzz.owned_fields(case)[0]


def fuzz_actions(cases: Tuple[str, ...]) -> st.SearchStrategy:
    """A fuzzed request (one to ``FUZZ_MAX_CASES`` of ``cases``, shrinking
    towards one case and the first, the valid ones) or an abort of an
    unknown rid."""
    return st.one_of(
        st.builds(A.FuzzRequest, cases=st.lists(st.sampled_from(cases), min_size=1, max_size=FUZZ_MAX_CASES,
                                                unique_by=_fields_key).map(tuple),
                  family=st.sampled_from(PROMPT_FAMILIES), prompt_len=st.sampled_from(FUZZ_PROMPT_LENGTHS),
                  max_new_tokens=st.integers(1, FUZZ_MAX_NEW_TOKENS)),
        st.just(A.AbortUnknown()),
    )


def hicache_gate_actions() -> st.SearchStrategy:
    return st.one_of(
        st.builds(A.HoldTransfers, loads=st.booleans(), backups=st.booleans())
        .filter(lambda a: a.loads or a.backups),
        st.just(A.ReleaseTransfers()),
    )


def action_strategy(topology: str, features: Optional[Tuple[str, ...]] = None,
                    fuzz_cases: Optional[Tuple[str, ...]] = None) -> st.SearchStrategy:
    """One action; HiCache's gate actions only with the feature on
    (``features``, by default the topology's own); fuzzed requests only with
    ``fuzz_cases`` (request fuzzing on: the field cases it draws)."""
    if features is None:
        features = engine_config.features_of(topology)
    names = windows_for(topology, features)
    choices = [
        st.builds(A.Steps, n=st.integers(1, MAX_STEPS_ACTION[topology])),
        starts(HICACHE_PROMPT_LENGTHS if "hicache" in features else PROMPT_LENGTHS,
               pipeline=LOOP_OF_TOPOLOGY[topology] == "pp"),
        control_ops(),
        st.builds(A.OnWindow, window=st.sampled_from(names),
                  op=control_ops().filter(_placed),
                  max_steps=st.just(WINDOW_WAIT_STEPS[topology])),
        resends(),
        turns(),
        turns(),  # twice: a turn continues another only where the program sent one before it (turns())
        st.builds(A.OnPhase, phase=st.sampled_from(TARGET_PHASES[LOOP_OF_TOPOLOGY[topology]]),
                  op=phase_ops(topology), max_steps=st.just(WINDOW_WAIT_STEPS[topology])),
    ]
    if kv_pressure_drawn(topology):
        choices.append(kv_pressure_actions())
    if "hicache" in features:
        choices.append(hicache_gate_actions())
        choices.append(starts(HICACHE_PROMPT_LENGTHS))  # new traffic twice as often: evictions, returns
    if "lora" in features:
        choices += [lora_starts(), lora_starts(), lora_ops(),
                    st.builds(A.OnPhase, phase=st.sampled_from(TARGET_PHASES[LOOP_OF_TOPOLOGY[topology]]),
                              op=lora_ops(), max_steps=st.just(WINDOW_WAIT_STEPS[topology]))]
    if "priority" in features:  # traffic with priorities, twice as often: full slots, preemptions
        choices += [priority_starts(), priority_starts()]
    if fuzz_cases:  # asked for: drawn three times as often as one other kind of action (twice until
        # grammar 13's turns, also drawn twice, made them rarer: 7 field cases in 80 programs, not 10+)
        choices += [fuzz_actions(fuzz_cases)] * 3
    loaded = sorted(extensions.actions())
    if loaded:  # a user's own actions (--extension), drawn like the built-in ones
        choices.append(st.builds(A.Extension, name=st.sampled_from(loaded)))
    return st.one_of(*choices)


def programs(topology: str, *, max_actions: int = MAX_ACTIONS,
             features: Optional[Tuple[str, ...]] = None,
             fuzz_cases: Optional[Tuple[str, ...]] = None) -> st.SearchStrategy:
    """Programs that start at least one request first (an empty engine has
    little to race with); the rest is free."""
    if features is None:
        features = engine_config.features_of(topology)
    if "hicache" in features:
        # With HiCache, a program may hold the copies from its start (a GPU whose copies lag the
        # scheduler), so a race with a pending copy needs only the requests that make one.
        hold = st.sampled_from([None, A.HoldTransfers(loads=True, backups=True),
                                A.HoldTransfers(loads=True, backups=False), A.HoldTransfers(loads=False, backups=True)])
        # and HiCache only acts once traffic overflows the device pool: first up to three prompts of
        # distinct prefixes (families 0, 1, 2 in turn), which later requests may return to
        first = st.lists(st.tuples(st.sampled_from(HICACHE_PROMPT_LENGTHS), st.integers(1, MAX_NEW_TOKENS)),
                         min_size=1, max_size=len(PROMPT_FAMILIES)).map(
            lambda drawn: [A.Start(n, PROMPT_FAMILIES[i], new) for i, (n, new) in enumerate(drawn)])
        return st.builds(lambda h, first, rest: ([h] if h else []) + first + rest, hold, first,
                         st.lists(action_strategy(topology, features, fuzz_cases), max_size=max_actions - 4))
    first = st.one_of(starts(), lora_starts()) if "lora" in features else starts()
    if "priority" in features:
        first = priority_starts()
    return st.builds(lambda first, rest: [first] + rest, first,
                     st.lists(action_strategy(topology, features, fuzz_cases), max_size=max_actions - 1))
