"""Hypothesis strategies for explored programs (harness process).

A program is a list of actions (``actions.py``). Alternatives are listed
simplest first, because Hypothesis shrinks towards the first: a failing
program shrinks towards fewer actions, plain steps, short prompts, few new
tokens.
"""
from __future__ import annotations

import functools
from typing import Callable, List, Optional, Sequence, Tuple

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
# A request's max_new_tokens: 1 to MAX_NEW_TOKENS (1 first: what a request shrinks to), or 0
# (last, one request in 13): a prefill-only request, which SGLang finishes at its prefill
# (length, no output) and which leaves the running batch by another path than a decoding one.
MAX_NEW_TOKEN_CHOICES = tuple(range(1, MAX_NEW_TOKENS + 1)) + (0,)
MAX_ACTIONS = 12
# How many earlier requests a Resend picks among, and how far up the length ladder it may go.
RESEND_PICKS = 4
RESEND_LONGER = 3
# Pages an ExhaustKv leaves free: none (nothing new is admitted; a decode batch retracts down
# to one request, which is then aborted), a few decode steps' worth, about one 64-token chunk,
# and room for one long prompt (the radix tree is evicted to make room). The CPU default's
# page is one token and its pool 8192 (pp1-hicache's 400).
KV_LEAVE_PAGES = (0, 4, 64, 200)
# ...or, half the time, any amount up to the largest: admission under pressure is
# decided by how the free KV compares with the waiting requests' needs (one fits, two do not;
# a decode step's worth short), so the levels between the named ones are drawn too.


def kv_leave_pages() -> st.SearchStrategy:
    """Pages an ExhaustKv leaves free: a named level (``KV_LEAVE_PAGES``,
    first), or any amount from 0 to the largest."""
    return st.one_of(st.sampled_from(KV_LEAVE_PAGES), st.integers(0, max(KV_LEAVE_PAGES)))

LOOP_OF_TOPOLOGY = {"pp1-overlap": "overlap", "pp1-normal": "normal", "pp4": "pp", "pp1-hicache": "normal",
                    "pp1-lora": "overlap", "pp1-priority": "overlap", "pp1-text": "overlap"}
# Steps "when window W opens" waits for it, per topology (PP steps are microbatch slots).
WINDOW_WAIT_STEPS = {"pp1-overlap": 24, "pp1-normal": 24, "pp4": 60, "pp1-hicache": 24, "pp1-lora": 24,
                     "pp1-priority": 24, "pp1-text": 24}
# Iterations a step action runs: 1 to 8 scheduler rounds. At pp=4 a round is the loop's six
# micro-batch slots (pp_loop_size), and a request decodes one token a round, so an operation
# drawn after "start, N steps" lands in a decode as often as at pp=1 (grammar 16; with 1 to 12,
# a 60-s ci search counted an operation in a decode 13 times of 758 operation x phase counts,
# 38 of 528 with 1 to 48).
MAX_STEPS_ACTION = {"pp1-overlap": 8, "pp1-normal": 8, "pp4": 48, "pp1-hicache": 8, "pp1-lora": 8,
                    "pp1-priority": 8, "pp1-text": 8}
# Iterations a step inside a sequence runs (between a sequence's ends, a burst's pressure and its
# release): 1 to 3 rounds, so at pp=4 1 to 18 (grammar 18; 1 to 3 before, half a round: a decode
# under a KV bracket's pressure made one token or none before the KV came back, so retract_decode,
# which needs a few decode steps to run the free KV down, never ran inside one).
SEQUENCE_GAP_STEPS = {"pp1-overlap": 3, "pp1-normal": 3, "pp4": 18, "pp1-hicache": 3, "pp1-lora": 3,
                      "pp1-priority": 3, "pp1-text": 3}


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


# Every kind of control operation, by family and name: each request the scheduler handles on
# a path of its own (a pause mode, a weight query, a session request each count as one). A
# control operation draws a family among those whose kinds the program keeps (``programs``),
# then a kind of that family, each as likely as the others. Before the swarm draw a draw went
# through Hypothesis's one_of, which flattens nested choices into one list of its leaves: a
# weight query was 1 control operation in 14, one query kind 1 in 140 (now 1 in 10 and 1 in
# 100 when a program keeps every kind).
CONTROL_OP_KINDS: Tuple[Tuple[str, str, st.SearchStrategy], ...] = (
    ("flush", "flush", st.just(A.Flush())),
    ("abort", "abort_one", st.builds(A.AbortOne, pick=st.integers(0, 3))),
    ("abort", "abort_all", st.just(A.AbortAll())),
    ("update", "update_disk", st.builds(A.UpdateWeights, flush=st.booleans())),
    ("update", "update_tensor", st.builds(A.UpdateWeights, flush=st.booleans(), tensor=st.just(True))),
    ("update", "update_distributed", st.builds(A.UpdateWeights, flush=st.booleans(), distributed=st.just(True))),
    ("update", "update_missing", st.builds(A.UpdateWeights, flush=st.booleans(), missing=st.just(True))),
    *(("pause", f"pause_{mode}", st.just(A.Pause(mode))) for mode in PAUSE_MODES),
    ("continue", "continue", st.just(A.Continue())),
    ("memory", "release_memory", st.builds(A.ReleaseMemory, tags=st.sampled_from(MEMORY_TAG_CHOICES))),
    ("memory", "resume_memory", st.just(A.ResumeMemory())),
    ("rl_cycle", "rl_cycle", rl_cycles()),
    ("knob", "set_limit", st.builds(A.SetLimit, value=st.sampled_from(LIMIT_VALUES))),
    ("knob", "slow_down", st.builds(A.SlowDown, ms=st.sampled_from(SLOW_DOWN_MS))),
    *(("query", f"query_{kind}", st.just(A.WeightQuery(kind))) for kind in WEIGHT_QUERIES),
    *(("session", f"session_{kind}", st.just(A.SessionOp(kind))) for kind in SESSION_OPS),
)
CONTROL_OP_NAMES = tuple(name for _, name, _ in CONTROL_OP_KINDS)
ALL_OP_KINDS = tuple(range(len(CONTROL_OP_KINDS)))
# The kinds an OnWindow / OnPhase may place: not those that only undo an earlier op of the
# program (continue, resume).
UNDOING_OP_KINDS = ("continue", "resume_memory")
PLACED_OP_KINDS = tuple(i for i in ALL_OP_KINDS if CONTROL_OP_NAMES[i] not in UNDOING_OP_KINDS)


def _kept_positions(names: Sequence[str], kept: Sequence[int]) -> Sequence[int]:
    """The positions in ``names`` (control-operation kind names) of the kinds
    ``kept`` holds; all of them when it holds none."""
    positions = {i for i, name in enumerate(names) if CONTROL_OP_NAMES.index(name) in kept}
    return positions or range(len(names))


PICK_TRIES = 8


def _pick(draw: Callable, options: Sequence, kept: Optional[Sequence[int]] = None):
    """One of ``options``, each as likely as the others (an explicit index:
    Hypothesis's one_of would flatten nested choices and merge repeated
    ones); shrinks towards the first. With ``kept``, one of the options at
    those positions: an index into all of them, drawn again while it falls
    on one left out (``PICK_TRIES`` times, then the first kept), so that an
    index means the same option whichever others a program keeps (which
    keeps a swarm program shrinking as well as any: ``_kept``)."""
    if kept is None:
        return options[draw(st.integers(0, len(options) - 1))]
    for _ in range(PICK_TRIES):
        i = draw(st.integers(0, len(options) - 1))
        if i in kept:
            return options[i]
    return options[min(kept)]


OP_FAMILIES = tuple(dict.fromkeys(family for family, _, _ in CONTROL_OP_KINDS))
OP_FAMILY_OF = tuple(OP_FAMILIES.index(family) for family, _, _ in CONTROL_OP_KINDS)  # per kind
OP_FAMILY_MEMBERS = tuple(tuple(i for i in ALL_OP_KINDS if OP_FAMILY_OF[i] == f) for f in range(len(OP_FAMILIES)))


@st.composite
def control_ops(draw: Callable, kept: Tuple[int, ...] = ALL_OP_KINDS, placed: bool = False) -> A.Action:
    """A control operation of one of the kinds ``kept`` (indices into
    ``CONTROL_OP_KINDS``): a family, then a kind of it; with ``placed``
    only those an OnWindow / OnPhase may place (all of those when ``kept``
    holds none)."""
    if placed:
        kept = tuple(i for i in kept if i in PLACED_OP_KINDS) or PLACED_OP_KINDS
    family = _pick(draw, range(len(OP_FAMILIES)), {OP_FAMILY_OF[i] for i in kept})
    members = OP_FAMILY_MEMBERS[family]
    index = _pick(draw, members, {members.index(i) for i in kept if OP_FAMILY_OF[i] == family})
    return draw(CONTROL_OP_KINDS[index][2])


# A request's logprobs (Start.logprob_start): none (first, and three times in seven), output
# logprobs only (-1), or input logprobs from the first token, inside the first chunk, or inside
# the second (70, clamped into a shorter prompt). A start below a cached prefix caps the prefix
# match there (SGLang's Req.init_next_round_input), so a Resend with one also recomputes.
LOGPROB_STARTS = (None, None, None, -1, 0, 32, 70)


# On a topology with a tokenizer ("text"), how many reference tokens a stop string spans (Start.stop_span):
# none (a stop token, first), one, two or three, or 0: the last character of one token and the first of
# the next (a string starting inside a token, whose occurrence spans one token more than its encoding)
STOP_SPANS = (None, 1, 2, 3, 0)


def _request_semantics() -> dict:
    """A request's drawn end: its max_new_tokens (``MAX_NEW_TOKEN_CHOICES``:
    0, a prefill-only request, one in 13); ignore_eos (True, the simpler, first), and
    no stop token (first) or the k-th token of its reference output;
    whether its answer is streamed (not first); whether it asks for
    logprobs, and from where (``LOGPROB_STARTS``)."""
    return {"max_new_tokens": st.sampled_from(MAX_NEW_TOKEN_CHOICES),
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


def starts(lengths=PROMPT_LENGTHS, *, pipeline: bool = False, text: bool = False) -> st.SearchStrategy:
    """A request; under PP (``pipeline``) it may wait for the micro-batch
    slot of a live request first: a request admitted into a micro-batch that
    is decoding others (its prefill merged into their running batch) needs
    its arrival to line up with that slot, one turn in ``pp_loop_size``
    (6 at pp=4) when started after a random number of steps."""
    extra = {"beside": st.one_of(st.none(), st.integers(0, BESIDE_PICKS - 1))} if pipeline else {}
    if text:  # a tokenizer: its stop (when it has one) a string of the reference's text, or a token
        extra["stop_span"] = st.sampled_from(STOP_SPANS)
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


def exhaust_kvs() -> st.SearchStrategy:
    """Taking the free KV but ``kv_leave_pages()``, evicting the tree or not."""
    return st.builds(A.ExhaustKv, leave_pages=kv_leave_pages(), evict_cache=st.booleans())


def kv_pressure_actions() -> st.SearchStrategy:
    return st.one_of(exhaust_kvs(), st.just(A.ReleaseKv()))


def kv_pressure_drawn(topology: str) -> bool:
    """KV pressure is drawn on every topology. Under PP every rank schedules
    on its own KV pool, so the harness takes the same room on each: its
    KV operations ride SGLang's request relay to every rank
    (``scheduler_side/rank_ops.py``), or the ranks would disagree about what
    fits (a harness artefact, not a bug)."""
    return topology in LOOP_OF_TOPOLOGY


# A burst (grammar 17): requests posted in one iteration, so SGLang takes them in together and
# admits as many as fit in one prefill pass; mostly under KV pressure at the boundary of what
# admission can take: with the tree evicted and every free slot taken but room for the burst's first k
# requests (prompt, new tokens and a page each) and less than the next one's, admission must
# stop after k. Half the burst's prompts are short (at most half a chunk: several fit in one
# pass's 64-token budget), half of any length (requests of very different lengths together).
# Or (grammar 18) under pressure while they decode: once one decodes, the free KV taken (the tree
# evicted) but the room SGLang's admitted requests may still need and 0 to one page per request
# more, held for 3 to 6 rounds, so that ``retract_decode`` runs (a decode runs short when the free KV
# is below a token per request). Posted together, under PP the requests share a micro-batch, and a
# batch retracts only while it holds more than one: before grammar 18 a pp4 dev run of 2,203
# programs reached a decode retraction 8 times.
BURST_SIZES = (2, 3, 4)
BURST_PRESSURES = ("none", "admission", "decode", "admission", "decode")
SHORT_PROMPT_LENGTHS = tuple(n for n in PROMPT_LENGTHS if 2 * n <= A.CHUNK_TOKENS)


def _admission_need(start: A.Start) -> int:
    """KV a request's admission counts on an empty tree: its prompt, its new tokens and a page."""
    return start.prompt_len + start.max_new_tokens + 1


def _boundary_offset(draw: Callable, next_need: int) -> int:
    """Where between room for k requests and room for k + 1 a burst's free
    KV lies: at either edge (exactly room for k; one token short of room
    for k + 1), as boundary-value tests draw, or anywhere between."""
    edge = draw(st.sampled_from(("low", "high", "between")))
    if edge == "low":
        return 0
    return next_need - 1 if edge == "high" else draw(st.integers(0, next_need - 1))


@functools.lru_cache(maxsize=None)
def together(lengths: Tuple[int, ...] = PROMPT_LENGTHS, text: bool = False) -> st.SearchStrategy:
    """``BURST_SIZES`` requests posted in one iteration, half of them on short
    prompts (several fit in one pass), half of any length. Built once per
    arguments: ``bursts`` asks for it at every draw."""
    short = tuple(n for n in lengths if n in SHORT_PROMPT_LENGTHS) or lengths
    one = st.one_of(starts(short, text=text), starts(lengths, text=text))
    return st.sampled_from(BURST_SIZES).flatmap(lambda n: st.tuples(*([one] * n)))


@st.composite
def bursts(draw: Callable, lengths: Tuple[int, ...] = PROMPT_LENGTHS, text: bool = False,
           wait: int = WINDOW_WAIT_STEPS["pp1-overlap"],
           gap_steps: int = SEQUENCE_GAP_STEPS["pp1-overlap"]) -> Tuple[A.Action, ...]:
    """A burst of requests (``BURST_SIZES``), four times in five under
    pressure (``BURST_PRESSURES``). At admission: once the engine is idle
    (within ``wait`` iterations), the free KV taken (the tree evicted
    first) but room for the first k of the burst's requests and less than
    the next one's; then the burst, a few steps (1 to ``gap_steps``), and
    the KV given back. Idle, because only there is the boundary where it
    is drawn: a running request holds room the take leaves it
    (``program.room_sglang_reserved``), which a pass charges only in part
    (its decode scaled by SGLang's new-token ratio, and under PP only in its
    own micro-batch). Or while they decode: the burst, then once a request
    decodes the free KV taken but 0 to one page per request beyond what
    SGLang's admitted requests may still need, held ``gap_steps`` to
    ``2 * gap_steps`` steps (3 to 6 rounds: a decode round takes a token
    per request), and given back. Without pressure first, so that a failure
    needing only the requests shrinks to them."""
    burst = list(draw(together(lengths, text)))
    pressure = draw(st.sampled_from(BURST_PRESSURES))
    if pressure == "none":
        return tuple(burst)
    if pressure == "decode":
        leave = draw(st.integers(0, len(burst)))
        return (*burst, A.OnPhase("decode", A.ExhaustKv(leave, evict_cache=True), wait),
                A.Steps(draw(st.integers(gap_steps, 2 * gap_steps))), A.ReleaseKv())
    k = draw(st.integers(1, len(burst) - 1))
    room = sum(_admission_need(r) for r in burst[:k]) + _boundary_offset(draw, _admission_need(burst[k]))
    return (A.OnPhase("idle", A.ExhaustKv(room, evict_cache=True), wait), *burst,
            A.Steps(draw(st.integers(1, gap_steps))), A.ReleaseKv())


def phase_ops(topology: str, kept: Tuple[int, ...] = ALL_OP_KINDS) -> st.SearchStrategy:
    """What an OnPhase does once its phase holds: a control operation of the
    kinds ``kept`` (not continue: there is nothing to continue unless the
    program paused), or, half the time, taking the free KV (memory running
    out mid-decode)."""
    ops = control_ops(kept, placed=True)
    if not kv_pressure_drawn(topology):
        return ops
    return st.one_of(ops, exhaust_kvs())


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


# Operation sequences (the swarm draw's): an operation that opens a state (a pause, a memory
# release, a profile, a lowered limit, ...), what happens in that state, and the operation that
# closes it; and a query before and after an operation. Clients drive them so (an RL framework
# pauses, updates and continues, and compares a checksum before and after; an operator lowers a
# limit and puts it back), and drawn as single operations the closing one rarely follows the
# opening one with only a few actions between.
SEQUENCE_BETWEEN = 3  # actions at most between a sequence's ends
OBSERVING_QUERIES = ("checksum", "snapshot", "compare", "get_weights", "version", "server_info")
# What opens a state and what closes it, by the control-operation kind that opens it (a pause
# is ``paused``'s, its modes being three kinds); with KV pressure drawn, taking the free KV and
# giving it back too (``bracketed``).
BRACKETS: Tuple[Tuple[str, st.SearchStrategy, A.Action], ...] = (
    ("release_memory", st.builds(A.ReleaseMemory, tags=st.sampled_from(MEMORY_TAG_CHOICES)), A.ResumeMemory()),
    ("query_profile", st.just(A.WeightQuery("profile")), A.WeightQuery("profile_stop")),
    ("set_limit", st.builds(A.SetLimit, value=st.sampled_from(tuple(v for v in LIMIT_VALUES if v != "default"))),
     A.SetLimit("default")),
    ("slow_down", st.just(A.SlowDown(1)), A.SlowDown(0)),
    ("session_open", st.just(A.SessionOp("open")), A.SessionOp("close")),
    ("query_snapshot", st.just(A.WeightQuery("snapshot")), A.WeightQuery("compare")),
)
KV_BRACKET = ("kv", exhaust_kvs(), A.ReleaseKv())


def _between(kept: Tuple[int, ...], start: st.SearchStrategy, gap_steps: int = SEQUENCE_GAP_STEPS["pp1-overlap"],
             burst: Optional[st.SearchStrategy] = None) -> st.SearchStrategy:
    """What a sequence holds between its ends: up to ``SEQUENCE_BETWEEN`` of
    a few steps (1 to ``gap_steps``), a request (``start``), a control
    operation of the kinds ``kept``, or with ``burst`` requests posted
    together (a tuple, flattened into the sequence)."""
    alternatives = [st.builds(A.Steps, n=st.integers(1, gap_steps)), start, control_ops(kept, placed=True)]
    if burst is not None:
        alternatives.append(burst)
    return st.lists(st.one_of(*alternatives), max_size=SEQUENCE_BETWEEN).map(_flat)


def _flat(items) -> Tuple[A.Action, ...]:
    return tuple(a for item in items for a in (item if isinstance(item, tuple) else (item,)))


def _opened(draw: Callable, op, loop_phases: Tuple[str, ...], windows_open: Tuple[str, ...], wait: int,
            start: Optional[st.SearchStrategy] = None) -> Tuple[A.Action, ...]:
    """``op`` at once (first), once a phase holds, when ``windows_open``
    names any once one of those race windows opens, or, given ``start``,
    posted right behind a new request (grammar 15): SGLang receives the two
    in one batch, so the operation is processed against a request queued
    in that very iteration and not admitted yet (a rollout's request
    arriving as the trainer pauses; the corpus's ``queued`` phase). Not a
    memory release: behind a request not processed yet the harness never
    posts one (``ctx.memory_release_allowed``: SGLang asserts idle), so it
    would be drawn only to be skipped. A pause or a memory release may also
    wait until the engine is idle (grammar 18): every request so far
    finished, the tree holding their prompts, where an RL framework pauses
    and releases between rollouts (SGLang's release asserts idle, so at
    another phase it is refused unless a retract pause emptied the engine,
    and under PP, which ignores a pause, never)."""
    arriving = start is not None and not isinstance(op, A.ReleaseMemory)
    idle = isinstance(op, (A.Pause, A.ReleaseMemory))
    kept = {0, 1} | ({2} if windows_open else set()) | ({3} if arriving else set()) | ({4} if idle else set())
    where = _pick(draw, ("now", "phase", "window", "arriving", "idle"), kept)
    if where == "idle":
        return (A.OnPhase("idle", op, wait),)
    if where == "phase":
        return (A.OnPhase(_pick(draw, loop_phases), op, wait),)
    if where == "window":
        return (A.OnWindow(_pick(draw, windows_open), op, wait),)
    if where == "arriving":
        return (draw(start), op)
    return (op,)


# The kinds that change the weights the queries read (an update of each path, the RL cycle, a
# memory release): what a weight query before and after an operation can see change.
WEIGHT_CHANGING_KINDS = ("update_disk", "update_tensor", "update_distributed", "rl_cycle", "release_memory")
WEIGHT_UPDATE_KINDS = ("update_disk", "update_tensor", "update_distributed")


def _kinds_kept(names: Sequence[str], kept: Tuple[int, ...]) -> Tuple[int, ...]:
    """The indices (into ``CONTROL_OP_KINDS``) of the kinds ``names`` that ``kept`` holds."""
    return tuple(CONTROL_OP_NAMES.index(n) for n in names if CONTROL_OP_NAMES.index(n) in kept)


# What a paused sequence does right after its pause: nothing (first, what a failure shrinks to), a
# weight update (half the time), or a memory release (a quarter, grammar 18).
PAUSED_FIRST = ("none", "update", "release", "update")


@st.composite
def paused(draw: Callable, kept: Tuple[int, ...], loop_phases: Tuple[str, ...], windows_open: Tuple[str, ...],
           wait: int, start: st.SearchStrategy,
           gap_steps: int = SEQUENCE_GAP_STEPS["pp1-overlap"]) -> Tuple[A.Action, ...]:
    """A pause of a kept mode, at once, once a phase holds, once a race
    window opens, right behind a new request or once idle (``_opened``);
    right after it (``PAUSED_FIRST``: not first) a weight update of a kept
    kind, what RL frameworks pause for (PR 10071), or (grammar 18) a memory
    release of a drawn tag, what colocated ones do next (the continue
    resumes it, and loads the weights first where they were released: the
    RL cycle as a sequence); what happens while paused (``_between``);
    then its continue."""
    pause = A.Pause(_pick(draw, PAUSE_MODES, _kept_positions([f"pause_{m}" for m in PAUSE_MODES], kept)))
    opened = _opened(draw, pause, loop_phases, windows_open, wait, start)
    updates = _kinds_kept(WEIGHT_UPDATE_KINDS, kept)
    first = draw(st.sampled_from(PAUSED_FIRST))
    update: Tuple[A.Action, ...] = ()
    if first == "update" and updates:
        update = (draw(control_ops(updates)),)
    elif first == "release" and _kinds_kept(("release_memory",), kept):
        update = (A.ReleaseMemory(draw(st.sampled_from(MEMORY_TAG_CHOICES))),)
    return (*opened, *update, *draw(_between(kept, start, gap_steps)), A.Continue())


@st.composite
def bracketed(draw: Callable, kept: Tuple[int, ...], loop_phases: Tuple[str, ...], windows_open: Tuple[str, ...],
              wait: int, start: st.SearchStrategy, kv: bool, gap_steps: int = SEQUENCE_GAP_STEPS["pp1-overlap"],
              burst: Optional[st.SearchStrategy] = None) -> Tuple[A.Action, ...]:
    """One of ``BRACKETS`` whose opening kind is kept (any when none is), or
    with ``kv`` taking the free KV: opened at once, once a phase holds,
    (a control operation) once a race window opens, or right behind a new
    request (``_opened``); what happens in it
    (``_between``); then its close. Inside a lowered micro-batch limit,
    given ``burst`` (``together``), requests may be posted together
    (grammar 18): the limit bounds how many requests one prefill admits,
    and under PP only requests that arrive in the same iteration meet in
    one micro-batch's prefill (one posted a step later is the next slot's)."""
    brackets = BRACKETS + (KV_BRACKET,) if kv else BRACKETS
    open_ones = {i for i, (name, _, _) in enumerate(brackets) if name == "kv" or CONTROL_OP_NAMES.index(name) in kept}
    name, opening, close = _pick(draw, brackets, open_ones or range(len(brackets)))
    op = draw(opening)
    first = _opened(draw, op, loop_phases, () if name == "kv" else windows_open, wait, start)
    limit_burst = burst if name == "set_limit" else None
    return (*first, *draw(_between(kept, start, gap_steps, limit_burst)), close)


# Which queries an observed operation has around it: none first, so that a failure needing only
# the operation shrinks to it (the queries drawn as part of the sequence could not be dropped one
# by one); one before or after; both half the time, mostly the same query twice ("same": a client
# compares a checksum, a version, a tensor before and after), sometimes two drawn apart.
OBSERVED_SHAPES = ("none", "before", "after", "same", "same", "both")


@st.composite
def observed(draw: Callable, kept: Tuple[int, ...]) -> Tuple[A.Action, ...]:
    """A weight query (of the kept kinds), a control operation, a query
    again (``OBSERVED_SHAPES``: either query may be left out, and both are
    mostly the same query). Half the time (not first) the operation is of
    a kept kind that changes the weights (``WEIGHT_CHANGING_KINDS``), the
    change the queries read."""
    queries = _kept_positions([f"query_{q}" for q in OBSERVING_QUERIES], kept)
    shape = draw(st.sampled_from(OBSERVED_SHAPES))
    first = _pick(draw, OBSERVING_QUERIES, queries) if shape in ("before", "same", "both") else None
    changing = _kinds_kept(WEIGHT_CHANGING_KINDS, kept)
    op = draw(control_ops(changing if changing and draw(st.booleans()) else kept, placed=True))
    last = (first if shape == "same" else
            _pick(draw, OBSERVING_QUERIES, queries) if shape in ("after", "both") else None)
    return (*([A.WeightQuery(first)] if first else []), op, *([A.WeightQuery(last)] if last else []))


# A kind of action (``action_kinds``): a function of the control-operation kinds a program
# keeps that returns the kind's strategy, and whether that strategy draws a sequence of
# actions (a tuple) rather than one.
ActionKind = Callable[[Tuple[int, ...]], st.SearchStrategy]


def action_kinds(topology: str, features: Tuple[str, ...],
                 fuzz_cases: Optional[Tuple[str, ...]]) -> Tuple[Tuple[ActionKind, bool], ...]:
    """The kinds of action a program on ``topology`` draws, each as likely as
    the others (a kind listed twice, twice as likely), as (kind, draws a
    sequence); HiCache's gate actions only with the feature on; fuzzed
    requests only with ``fuzz_cases`` (request fuzzing on: the field cases
    it draws); the user's own actions where extensions are loaded."""
    return _action_kinds(topology, tuple(features), fuzz_cases, tuple(sorted(extensions.actions())))


@functools.lru_cache(maxsize=None)
def _action_kinds(topology: str, features: Tuple[str, ...], fuzz_cases: Optional[Tuple[str, ...]],
                  loaded: Tuple[str, ...]) -> Tuple[Tuple[ActionKind, bool], ...]:
    names = windows_for(topology, features)
    wait = WINDOW_WAIT_STEPS[topology]
    loop_phases = TARGET_PHASES[LOOP_OF_TOPOLOGY[topology]]
    steps = st.builds(A.Steps, n=st.integers(1, MAX_STEPS_ACTION[topology]))
    gap = SEQUENCE_GAP_STEPS[topology]
    lengths = HICACHE_PROMPT_LENGTHS if "hicache" in features else PROMPT_LENGTHS
    start = starts(lengths, pipeline=LOOP_OF_TOPOLOGY[topology] == "pp", text="text" in features)
    arriving_together = together(lengths, text="text" in features)
    resend, turn = resends(), turns()
    single: List[ActionKind] = [
        lambda ops: steps,
        lambda ops: start,
        lambda ops: control_ops(ops),
        lambda ops: st.builds(A.OnWindow, window=st.sampled_from(names), op=control_ops(ops, placed=True),
                              max_steps=st.just(wait)),
        lambda ops: resend,
        lambda ops: turn,
        lambda ops: turn,  # twice: a turn continues another only where the program sent one before it (turns())
        lambda ops: st.builds(A.OnPhase, phase=st.sampled_from(loop_phases), op=phase_ops(topology, ops),
                              max_steps=st.just(wait)),
    ]
    kv = kv_pressure_drawn(topology)
    sequences: List[ActionKind] = [
        lambda ops: paused(ops, loop_phases, names, wait, start, gap),
        lambda ops: bracketed(ops, loop_phases, names, wait, start, kv, gap, arriving_together),
        lambda ops: observed(ops),
    ]
    if kv:
        pressure = kv_pressure_actions()
        single.append(lambda ops: pressure)
        burst = bursts(lengths, text="text" in features, wait=wait, gap_steps=gap)
        # twice as likely as another kind (grammar 18): a burst carries two pressures (admission, decode)
        sequences += [lambda ops: burst, lambda ops: burst]
    if "hicache" in features:
        gate, hicache_start = hicache_gate_actions(), starts(HICACHE_PROMPT_LENGTHS)
        single += [lambda ops: gate, lambda ops: hicache_start]  # new traffic twice as often: evictions, returns
    if "lora" in features:
        lora_start, lora_op = lora_starts(), lora_ops()
        lora_on_phase = st.builds(A.OnPhase, phase=st.sampled_from(loop_phases), op=lora_op, max_steps=st.just(wait))
        single += [lambda ops: lora_start, lambda ops: lora_start, lambda ops: lora_op, lambda ops: lora_on_phase]
    if "priority" in features:  # traffic with priorities, twice as often: full slots, preemptions
        priority_start = priority_starts()
        single += [lambda ops: priority_start] * 2
    if fuzz_cases:  # asked for: drawn three times as often as one other kind of action (twice until
        # grammar 13's turns, also drawn twice, made them rarer: 7 field cases in 80 programs, not 10+)
        fuzz = fuzz_actions(fuzz_cases)
        single += [lambda ops: fuzz] * 3
    if loaded:  # a user's own actions (--extension), drawn like the built-in ones
        extension = st.builds(A.Extension, name=st.sampled_from(loaded))
        single.append(lambda ops: extension)
    return tuple((kind, False) for kind in single) + tuple((kind, True) for kind in sequences)


@st.composite
def _one_action(draw: Callable, kinds: Tuple[Tuple[ActionKind, bool], ...], kept: Sequence[int],
                kept_ops: Tuple[int, ...]):
    """An action (or a sequence) of one of the kinds at positions ``kept``."""
    kind, _ = _pick(draw, kinds, kept)
    return draw(kind(kept_ops))


def action_strategy(topology: str, features: Optional[Tuple[str, ...]] = None,
                    fuzz_cases: Optional[Tuple[str, ...]] = None) -> st.SearchStrategy:
    """One action of any kind that draws one (``action_kinds``), any control
    operation: what a novelty mutant puts into a corpus program."""
    if features is None:
        features = engine_config.features_of(topology)
    kinds = action_kinds(topology, tuple(features), fuzz_cases)
    return _one_action(kinds, frozenset(i for i, (_, sequence) in enumerate(kinds) if not sequence), ALL_OP_KINDS)


# Swarm testing (Groce, Zhang, Eide, Chen, Regehr, "Swarm Testing", ISSTA 2012): each program
# first draws which kinds of action and of control operation it keeps, each left out with
# probability 1/2, then draws its actions among those only. A shape that needs a few kinds
# together and few others around them (a retract pause while requests decode, and its
# continue; a checksum, an update, a checksum) is much likelier in a program that left most
# other kinds out than in one that mixes all ~50 kinds in the same proportions as every other
# program; over many programs every kind is still drawn. Hypothesis shrinks the leave-out draws
# towards keeping every kind. Measured against the draw before it in bench/README.md ("The
# swarm draw").


def _kept(draw: Callable, n: int) -> Tuple[int, ...]:
    """Which of ``n`` kinds a program keeps: each left out (a True draw, one
    in two) or kept; all of them if none is left."""
    left_out = [draw(st.booleans()) for _ in range(n)]
    return tuple(i for i in range(n) if not left_out[i]) or tuple(range(n))


@st.composite
def swarm_actions(draw: Callable, kinds: Tuple[Tuple[ActionKind, bool], ...], max_size: int) -> List[A.Action]:
    """Up to ``max_size`` actions of the kinds (``action_kinds``) this
    program keeps (swarm testing, above); a sequence kind's actions count
    one each."""
    kept = frozenset(_kept(draw, len(kinds)))
    kept_ops = _kept(draw, len(CONTROL_OP_KINDS))
    drawn = draw(st.lists(_one_action(kinds, kept, kept_ops), max_size=max_size))
    flat: List[A.Action] = []
    for item in drawn:
        flat.extend(item if isinstance(item, tuple) else (item,))
    return flat[:max_size]


def programs(topology: str, *, max_actions: int = MAX_ACTIONS,
             features: Optional[Tuple[str, ...]] = None,
             fuzz_cases: Optional[Tuple[str, ...]] = None) -> st.SearchStrategy:
    """Programs that start at least one request first (an empty engine has
    little to race with); the rest is free, drawn among the kinds of action
    the program keeps (swarm testing, above)."""
    if features is None:
        features = engine_config.features_of(topology)
    features = tuple(features)
    kinds = action_kinds(topology, features, fuzz_cases)
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
                         swarm_actions(kinds, max_actions - 4))
    first = st.one_of(starts(), lora_starts()) if "lora" in features else starts()
    if "priority" in features:
        first = priority_starts()
    return st.builds(lambda first, rest: [first] + rest, first,
                     swarm_actions(kinds, max_actions - 1))
