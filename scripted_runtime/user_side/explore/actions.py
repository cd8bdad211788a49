"""The actions an explored program is made of, and the Python source they
compile to.

A program is a list of actions. Its prompts are token sequences of a few
families (``scheduler_side/explore/prompts.py``), named in the source as
``explore.prompt_ids(family, length)``. It is never interpreted: ``to_source``
turns it into a plain scenario function (``def program(ctx): ...``) over
the public context API and the helpers in
``scheduler_side/explore/program.py``, and that
source is what runs in the scheduler, what a failure is written out as, and
what ``scripted-runtime run`` replays. One text, so the written file cannot
drift from what was explored.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple, Union

from scripted_runtime.scheduler_side.explore.interpreter import PROGRAM_FUNCTION

CHUNK_TOKENS = 64  # engine_config.COMMON["chunked_prefill_size"]
# Bump when an action's meaning or fields change: stored failing programs
# (``failure_db``) are keyed by it, so an old program is never replayed as a new one.
# 2: a Start's prompt is a pseudo-random family sequence (``prompts.prompt_ids``), not one
# repeated token; Start draws ignore_eos and a stop token; Resend, ExhaustKv, ReleaseKv.
# 3: Start and Resend draw ``stream``; ExhaustKv leaves room for the largest request SGLang
# holds (not a fixed 256 tokens) and may evict the radix cache first (``evict_cache``).
# 4: OnPhase (an operation once a scheduler phase holds: decoding, queued, ...).
# 5: FuzzRequest and AbortUnknown (request-field fuzzing, drawn with --fuzz-requests).
# 6: the RL weight-sync cycle: Pause mode "abort", ReleaseMemory, ResumeMemory, RlCycle;
# Continue resumes released memory first; Starts are skipped while memory is released.
# 7: runtime knobs and weight queries: SetLimit, SlowDown, WeightQuery; UpdateWeights.tensor; SessionOp.
# 8: LoRA (a LoRA topology only): Start.lora (a request served with an adapter), LoraOp (load, unload);
# WeightQuery kinds log_level (configure_logging), profile and profile_stop (the torch profiler).
# 9: Start.beside (under PP: the start waits for the micro-batch slot of a live request).
# 10: UpdateWeights.distributed and RlCycle.distributed (the trainer rank's broadcast through
# update_weights_from_distributed, the group joined first; pp=1: under PP the disk update instead).
# 11: Start and Resend draw ``logprob_start`` (return_logprob with the 2 best per token, input
# logprobs from a prompt position or none), judged by the logprob contract; LoraOp kind
# "load_tensors" (load_lora_adapter_from_tensors), on a LoRA topology.
# 12: Start.priority (a priority-scheduling topology only: none sent, or a priority of PRIORITIES),
# judged by the priority contract.
# 13: Turn (a session turn: a conversation's first turn in a session opened for it, or a turn
# continuing an earlier turn of the program, its prompt the history SGLang builds).
# 14: UpdateWeights.missing (a disk update of a checkpoint that does not exist: a failure path).
# 15: a sequence's opening operation may be posted right behind a new request (the two received in
# one batch: the operation processed against a request not admitted yet); every derandomized
# program differs.
# 16: at pp=4 a step action is 1 to 48 iterations (1 to 8 rounds of the six micro-batch slots, as
# pp=1's 1 to 8), not 1 to 12: a request decodes one token a round there.
# 17: a burst (a sequence, with KV pressure drawn): requests posted in one iteration under free KV
# at the boundary of what one prefill pass can admit (room for the first k, not k + 1).
# 18: a step inside a sequence is 1 to 3 rounds (at pp=4 1 to 18 iterations, not 1 to 3); a burst
# may come under KV pressure while it decodes, and is drawn twice as often; a pause or a release may
# wait for idle, and a paused sequence may release memory; inside a lowered micro-batch limit,
# requests may be posted together; a memory release first waits for the program's pause and
# continue to be answered (behind an unanswered pause it was always skipped).
GRAMMAR_VERSION = 18
# A request's priority on a priority-scheduling topology (pp1-priority: higher first, SGLang's
# preemption threshold 10): none sent (SGLang's worst, preempted by any other), 0 twice, 5 (better
# than 0, not past the threshold: waits), 20 (past it: preempts a 0 or none).
PRIORITIES = (None, 0, 0, 5, 20)
# The harness's LoRA adapters (user_side/models/lora_adapters.py ADAPTERS) and the prompt lengths a
# request with one draws (the output oracle computes each adapter's references of them up front).
LORA_ADAPTERS = ("lora0", "lora1", "lora2")
LORA_PROMPT_LENGTHS = (8, 64, 65, 129)
# The prompt lengths programs use: around the 64-token chunk boundaries (1, 2 and 3
# chunks), simplest first for shrinking. Part of the grammar: a Resend's "longer" steps up
# this ladder, and the output oracle's warm-up computes every (family, length) of it.
PROMPT_LENGTHS = (8, 1, 63, 64, 65, 100, 127, 128, 129, 150, 192)
LENGTH_LADDER = tuple(sorted(PROMPT_LENGTHS))


@dataclass(frozen=True)
class Steps:
    n: int

    def describe(self) -> str:
        return f"step {self.n}"


def logprob_start_of(drawn: int, prompt_len: int) -> int:
    """The ``logprob_start_len`` a drawn ``logprob_start`` posts for a prompt
    of ``prompt_len`` tokens: -1 as it is (output logprobs only), a position
    clamped into the prompt (SGLang aborts a start past it)."""
    return drawn if drawn < 0 else min(drawn, prompt_len - 1)


def _request_words(max_new_tokens: int, ignore_eos: bool, stop_at: Optional[int], stream: bool = False,
                   logprob_start: Optional[int] = None, stop_span: Optional[int] = None) -> str:
    words = f"{max_new_tokens} new"
    if stream:
        words += ", streamed"
    if logprob_start is not None:
        words += (", output logprobs" if logprob_start < 0 else
                  f", logprobs from prompt token {logprob_start}")
    if not ignore_eos:
        words += ", EOS ends it"
    if stop_at is not None and stop_span == 0:
        words += f", stop string: its reference's text across tokens {stop_at} and {stop_at + 1}"
    elif stop_at is not None and stop_span is not None:
        words += f", stop string: the text of its reference's tokens {stop_at}-{stop_at + stop_span - 1}"
    elif stop_at is not None:
        words += f", stop token: its reference's token {stop_at}"
    return words


def _prompt_words(family: int, length: int) -> str:
    chunks = -(-length // CHUNK_TOKENS)
    return f"{length} tokens of family {family} ({chunks} chunk{'s' if chunks > 1 else ''})"


@dataclass(frozen=True)
class Start:
    """Start a greedy request. Its prompt is ``prompts.prompt_ids(family,
    prompt_len)``: requests of one family share the prefix of the shorter
    (radix hits), of different families nothing. ``ignore_eos=False`` lets
    the model's EOS end it; ``stop_at=k`` passes the k-th token of the
    prompt's reference output as its stop token (``program.stop_tokens``),
    so the stop fires at position k or before. ``stream=True`` asks for a
    streamed answer (every event judged by the answer-delivery check)."""

    prompt_len: int
    family: int
    max_new_tokens: int
    ignore_eos: bool = True
    stop_at: Optional[int] = None
    stream: bool = False
    # return_logprob with the 2 best per token; input logprobs from this prompt position (clamped
    # into the prompt, ``logprob_start_of``), or -1: output logprobs only. None: no logprobs.
    logprob_start: Optional[int] = None
    lora: Optional[str] = None  # a LoRA adapter (LORA_ADAPTERS), loaded first if it is not
    # under PP: started when the loop comes to the micro-batch slot of live request #beside
    # (``program.join_batch_of``), so it is merged into that slot's running batch
    beside: Optional[int] = None
    priority: Optional[int] = None  # its priority (a priority-scheduling topology); None: none sent
    # With stop_at, on a topology with a tokenizer: a stop string instead of a stop token, the text
    # of the reference's tokens stop_at .. stop_at + stop_span - 1, or for 0 the last character of
    # token stop_at and the first of the next (``program.stop_texts``)
    stop_span: Optional[int] = None

    def _start(self) -> Optional[int]:
        return None if self.logprob_start is None else logprob_start_of(self.logprob_start, self.prompt_len)

    def describe(self) -> str:
        return (f"start: {_prompt_words(self.family, self.prompt_len)}, "
                + _request_words(self.max_new_tokens, self.ignore_eos, self.stop_at, self.stream, self._start(),
                                 self.stop_span)
                + (f", LoRA adapter {self.lora}" if self.lora else "")
                + (f", priority {self.priority}" if self.priority is not None else "")
                + (f", in the micro-batch of live request #{self.beside}" if self.beside is not None else ""))


@dataclass(frozen=True)
class Resend:
    """Start a request on an earlier request's prompt: request ``pick`` of
    those the program started before it (modulo their number, Starts and
    Resends in program order), its prompt as it was (``longer=0``: a full
    prefix hit) or the same family's prompt ``longer`` lengths further up
    ``LENGTH_LADDER`` (a partial hit on the node the earlier request left;
    the longest stays as it is). Resolved when the source is written
    (``resolve_prompts``); with no earlier request it does nothing."""

    pick: int
    longer: int
    max_new_tokens: int
    ignore_eos: bool = True
    stop_at: Optional[int] = None
    stream: bool = False
    logprob_start: Optional[int] = None  # as Start's

    def describe(self, resolved: Optional[Tuple[int, int, int]] = None) -> str:
        """``resolved``: (action index, family, length) from ``resolve_prompts``, when known."""
        how = "as it was" if not self.longer else f"{self.longer} length{'s' if self.longer > 1 else ''} longer"
        if resolved is None:
            what = f"earlier request #{self.pick}'s prompt {how}"
        else:
            index, family, length = resolved
            what = f"action {index + 1}'s prompt {how}: {_prompt_words(family, length)}"
        start = self.logprob_start
        if start is not None and resolved is not None:
            start = logprob_start_of(start, resolved[2])
        words = _request_words(self.max_new_tokens, self.ignore_eos, self.stop_at, self.stream, start)
        return f"resend {what}, {words}"


@dataclass(frozen=True)
class ExhaustKv:
    """Take every free KV slot but ``leave_pages`` pages (``ctx.exhaust_kv``):
    admission, ``retract_decode`` and tree eviction under memory pressure.
    Under PP every rank takes the same room from its own pool
    (``strategies.kv_pressure_drawn``)."""

    leave_pages: int
    evict_cache: bool = False  # evict the radix tree's evictable KV first and take it too

    def describe(self) -> str:
        evicted = ", the radix cache evicted first" if self.evict_cache else ""
        return f"exhaust KV: hold every free slot but {self.leave_pages} pages{evicted}"


@dataclass(frozen=True)
class ReleaseKv:
    def describe(self) -> str:
        return "give the held KV back"


@dataclass(frozen=True)
class Flush:
    def describe(self) -> str:
        return "flush_cache"


@dataclass(frozen=True)
class UpdateWeights:
    flush: bool
    tensor: bool = False  # the checkpoint's tensors through update_weights_from_tensor (a begin/end session)
    # the harness's trainer rank broadcasts the checkpoint through update_weights_from_distributed
    # (a begin/end session; the weight-update group joined first)
    distributed: bool = False
    # a disk update of a checkpoint path that does not exist: SGLang answers failure, and the update
    # must leave the weights, their version label and the pools as they were (grammar 14)
    missing: bool = False

    def describe(self) -> str:
        if self.missing:
            return (f"update_weights_from_disk(flush_cache={self.flush}) of a checkpoint that does not exist "
                    "(it must fail and change nothing)")
        if self.distributed:
            return (f"update_weights_from_distributed(flush_cache={self.flush}) in a begin/end weight-update "
                    "session, the trainer rank broadcasting")
        if self.tensor:
            return f"update_weights_from_tensor(flush_cache={self.flush}) in a begin/end weight-update session"
        return f"update_weights_from_disk(flush_cache={self.flush})"


@dataclass(frozen=True)
class Pause:
    mode: str  # "in_place" | "retract" | "abort" (the tokenizer aborts every request; program.pause)

    def describe(self) -> str:
        return f"pause_generation({self.mode})"


@dataclass(frozen=True)
class Continue:
    def describe(self) -> str:
        return "continue_generation (memory released before it resumed first)"


@dataclass(frozen=True)
class ReleaseMemory:
    """``release_memory_occupation`` of ``tags`` (``"all"``, ``"kv_cache"``,
    ``"weights"``) where SGLang's precondition holds (idle, or paused with
    only waiting requests), else nothing (``program.release_memory``)."""

    tags: str

    def describe(self) -> str:
        return f"release_memory_occupation({self.tags}) if SGLang allows it now"


@dataclass(frozen=True)
class ResumeMemory:
    """Resume everything released, the RL order: weights, a weight update
    (the release lost them), the rest (``program.resume_memory``)."""

    def describe(self) -> str:
        return "resume_memory_occupation of what is released (weights first, then a weight update)"


@dataclass(frozen=True)
class RlCycle:
    """An RL framework's weight sync (``program.rl_cycle``): pause
    (``pause_mode``), ``gap`` steps, release ``tags`` where SGLang allows
    it, resume weights + update (or the update alone), resume the rest,
    ``gap`` steps, continue."""

    pause_mode: str
    tags: str
    gap: int = 0
    distributed: bool = False  # the update broadcast by the trainer rank (update_weights_from_distributed)

    def describe(self) -> str:
        return (f"RL weight sync: pause({self.pause_mode}), release({self.tags}) if allowed, "
                f"{'broadcast update' if self.distributed else 'update'}, resume, "
                f"continue ({self.gap} steps between)")


@dataclass(frozen=True)
class SetLimit:
    """``set_internal_state(pp_max_micro_batch_size=...)``: ``value`` is
    ``"1"``, ``"2"``, ``"default"`` (the value the server came up with), or
    one SGLang must refuse: ``"zero"``, ``"above"`` (its range's top + 1)
    (``program.set_micro_batch_limit``)."""

    value: str

    def describe(self) -> str:
        return f"set the micro-batch limit to {self.value} (set_internal_state)"


@dataclass(frozen=True)
class SlowDown:
    """``slow_down``: every forward sleeps ``ms`` milliseconds (0: no more)."""

    ms: int

    def describe(self) -> str:
        return f"slow_down({self.ms} ms)" if self.ms else "slow_down cleared"


@dataclass(frozen=True)
class WeightQuery:
    """A weight or state query (``program.weight_query``): ``checksum``,
    ``snapshot``, ``compare`` (against the program's own snapshot, else a
    checksum), ``get_weights`` (a few rows of a parameter), ``version``
    (a new weight-version label), ``server_info``, ``freeze_gc``; and the
    diagnostics: ``log_level`` (``configure_logging``), ``profile`` (a CPU
    profile of two forwards), ``profile_stop``. Nothing that reads the
    weights while they are released."""

    kind: str

    def describe(self) -> str:
        return f"weight/state query: {self.kind}"


@dataclass(frozen=True)
class SessionOp:
    """``open`` a session, ``reopen`` the last one (refused while open),
    ``close`` the last one open (``program.session_op``)."""

    kind: str

    def describe(self) -> str:
        return f"session: {self.kind}"


# A session turn's own input lengths (a Turn; its first turn's prompt is one of them too): one
# token, a short one, one to a chunk boundary and one past it, so the history SGLang builds
# crosses the 64-token chunk boundaries at different points. The turns a Turn may continue:
# one of the program's first few, modulo their number.
TURN_INPUT_LENGTHS = (8, 1, 63, 65)
TURN_PICKS = 3


@dataclass(frozen=True)
class Turn:
    """A session turn (``program.session_turn``): ``after=None`` starts a
    conversation, its first turn in a session opened for it; ``after=k``
    continues the program's turn ``k`` (modulo their number; a first turn
    when there is none) in that turn's session with input
    ``prompts.prompt_ids(family, input_len)``, once that turn has ended (a
    chat client's next turn follows the answer), or at once with ``eager``.
    SGLang builds the turn's prompt from the history (the turn it
    continues, its whole prompt and output, then the input); the output
    oracle compares it with a fresh request of that history as the
    client's conversation makes it. A turn after one still running is
    aborted by SGLang ("appending to a request that hasn't finished"), one
    in a closed session too: both are drawn."""

    after: Optional[int]
    family: int
    input_len: int
    max_new_tokens: int
    stream: bool = False
    eager: bool = False  # sent at once, not after the turn it continues ended

    def describe(self) -> str:
        words = _request_words(self.max_new_tokens, True, None, self.stream)
        what = (f"a conversation's first turn (a session opened for it): {_prompt_words(self.family, self.input_len)}"
                if self.after is None else
                f"a turn continuing turn #{self.after}"
                + (" (sent at once)" if self.eager else " once it ended")
                + f": its history, then {_prompt_words(self.family, self.input_len)}")
        return f"session turn: {what}, {words}"


@dataclass(frozen=True)
class LoraOp:
    """``load``, ``load_tensors`` (the same adapter from its tensors:
    ``ctx.load_lora_adapter_from_tensors``) or ``unload`` LoRA adapter
    ``adapter`` (``program.lora_op``; a LoRA topology only). An unload reaches the scheduler only once every
    request using the adapter has finished (SGLang's tokenizer waits)."""

    kind: str
    adapter: str

    def describe(self) -> str:
        return f"LoRA: {self.kind} {self.adapter}"


@dataclass(frozen=True)
class AbortOne:
    pick: int  # index into the live requests, modulo their number

    def describe(self) -> str:
        return f"abort one live request (#{self.pick})"


@dataclass(frozen=True)
class AbortAll:
    def describe(self) -> str:
        return "abort_all"


Op = Union[Flush, UpdateWeights, Pause, Continue, AbortOne, AbortAll, ReleaseMemory, ResumeMemory, RlCycle, SetLimit,
           SlowDown, WeightQuery, SessionOp, LoraOp]


@dataclass(frozen=True)
class OnWindow:
    window: str
    op: Op
    max_steps: int

    def describe(self) -> str:
        return f"when {self.window} opens (within {self.max_steps} steps): {self.op.describe()}"


@dataclass(frozen=True)
class OnPhase:
    """``op`` once the scheduler is in ``phase`` (a column of the coverage
    table, ``scheduler_side/explore/phases.py``: ``decode``, ``queued``,
    ``prefill_chunk``, ``finished_unpruned``, ``pp_in_flight``), stepping
    at most ``max_steps`` iterations for it; nothing when it does not come.
    Where a window is a named race, a phase is the everyday state an RL
    framework's abort, pause or flush lands in (a decode batch running).
    ``op`` may also be an ExhaustKv (off PP): memory running out while a
    batch decodes is what makes ``retract_decode`` run."""

    phase: str
    op: Union[Op, "ExhaustKv"]
    max_steps: int

    def describe(self) -> str:
        return f"when the scheduler is in phase {self.phase} (within {self.max_steps} steps): {self.op.describe()}"


@dataclass(frozen=True)
class FuzzRequest:
    """Send a request with malformed or extreme fields (``explore.fuzz_request``):
    the base request (a prompt of ``family`` and ``prompt_len``,
    ``max_new_tokens``) with the field ``cases`` of
    ``scheduler_side/request_fuzz.py`` applied, judged by the survival
    contract. Drawn only with request fuzzing on; held back, like a Start,
    while the program's pause holds the tokenizer."""

    cases: Tuple[str, ...]
    family: int = 0
    prompt_len: int = 8
    max_new_tokens: int = 4

    def __post_init__(self) -> None:  # a list read back from JSON (the failure database) is the same program
        object.__setattr__(self, "cases", tuple(self.cases))

    def describe(self) -> str:
        return (f"fuzzed request: {', '.join(self.cases)} on {_prompt_words(self.family, self.prompt_len)}, "
                f"{self.max_new_tokens} new")


@dataclass(frozen=True)
class AbortUnknown:
    def describe(self) -> str:
        return "abort a rid no request ever had"


@dataclass(frozen=True)
class Extension:
    """An explorer action a user's module registers (``scripted_runtime/extensions.py``)."""

    name: str

    def describe(self) -> str:
        return f"{self.name} (extension action)"


@dataclass(frozen=True)
class HoldTransfers:
    """Hold HiCache's copies from now on (``hooks/hicache_gate.py``); drawn
    only on a topology with HiCache on."""

    loads: bool
    backups: bool

    def describe(self) -> str:
        what = " and ".join(k for k, on in (("loads", self.loads), ("backups", self.backups)) if on) or "nothing"
        return f"hold HiCache {what}"


@dataclass(frozen=True)
class ReleaseTransfers:
    def describe(self) -> str:
        return "release held HiCache transfers"


Action = Union[Steps, Start, Flush, UpdateWeights, Pause, Continue, AbortOne, AbortAll, OnWindow, OnPhase, Extension,
               HoldTransfers, ReleaseTransfers, Resend, ExhaustKv, ReleaseKv, FuzzRequest, AbortUnknown,
               ReleaseMemory, ResumeMemory, RlCycle, SetLimit, SlowDown, WeightQuery, SessionOp, LoraOp, Turn]


def _op_lines(op: Union[Op, "ExhaustKv"]) -> List[str]:
    if isinstance(op, ExhaustKv):
        return [f"yield from explore.exhaust_kv(ctx, {op.leave_pages}" + (", evict_cache=True)" if op.evict_cache else ")")]
    if isinstance(op, Flush):
        return ["yield from explore.flush_cache(ctx)"]
    if isinstance(op, UpdateWeights):
        return [f"yield from explore.update_weights(ctx, reqs, flush_cache={op.flush}"
                + (", tensor=True" if op.tensor else "") + (", distributed=True" if op.distributed else "")
                + (", missing=True" if op.missing else "") + ")"]
    if isinstance(op, Pause):
        if op.mode == "abort":
            return [f"yield from explore.pause(ctx, reqs, {op.mode!r})"]
        return [f"ctx.pause_generation({op.mode!r})"]
    if isinstance(op, Continue):
        return ["yield from explore.continue_generation(ctx, reqs)"]
    if isinstance(op, ReleaseMemory):
        return [f"yield from explore.release_memory(ctx, {op.tags!r})"]
    if isinstance(op, ResumeMemory):
        return ["yield from explore.resume_memory(ctx, reqs)"]
    if isinstance(op, RlCycle):
        return [f"yield from explore.rl_cycle(ctx, reqs, pause_mode={op.pause_mode!r}, tags={op.tags!r}, "
                f"gap={op.gap}" + (", distributed=True)" if op.distributed else ")")]
    if isinstance(op, SetLimit):
        return [f"yield from explore.set_micro_batch_limit(ctx, {op.value!r})"]
    if isinstance(op, SlowDown):
        return [f"yield from explore.slow_down(ctx, {op.ms / 1000!r})"]
    if isinstance(op, WeightQuery):
        return [f"yield from explore.weight_query(ctx, {op.kind!r})"]
    if isinstance(op, SessionOp):
        return [f"yield from explore.session_op(ctx, {op.kind!r})"]
    if isinstance(op, LoraOp):
        return [f"yield from explore.lora_op(ctx, {op.kind!r}, {op.adapter!r})"]
    if isinstance(op, AbortOne):
        return [f"explore.abort_one(ctx, reqs, {op.pick})"]
    if isinstance(op, AbortAll):
        return ["ctx.abort_all()"]
    raise TypeError(f"not a control operation: {op!r}")


def _longer(length: int, steps: int) -> int:
    """``length`` moved ``steps`` places up ``LENGTH_LADDER`` (capped at its top)."""
    above = [n for n in LENGTH_LADDER if n > length]
    if not steps or not above:
        return length
    return above[min(steps, len(above)) - 1]


def _resolve(actions: Sequence[Action]) -> List[Optional[Tuple[int, int, int]]]:
    """Per action, (the index of the action whose prompt it starts from,
    family, length), or None: see ``resolve_prompts``."""
    started: List[Tuple[int, int, int]] = []
    out: List[Optional[Tuple[int, int, int]]] = []
    for i, action in enumerate(actions):
        resolved: Optional[Tuple[int, int, int]] = None
        if isinstance(action, Start):
            resolved = (i, action.family, action.prompt_len)
        elif isinstance(action, Resend) and started:
            _, family, length = earlier = started[action.pick % len(started)]
            resolved = (earlier[0], family, _longer(length, action.longer))
        if resolved is not None:
            started.append((i, resolved[1], resolved[2]))
        out.append(resolved)
    return out


def resolve_prompts(actions: Sequence[Action]) -> List[Optional[Tuple[int, int]]]:
    """Per action, the (family, length) of the prompt it starts, or None
    (not a request, or a Resend with no earlier request). A request a pause
    holds back at run time still counts as started here: the resolution
    depends on the program's text only."""
    return [None if r is None else (r[1], r[2]) for r in _resolve(actions)]


def describe_program(actions: Sequence[Action]) -> List[str]:
    """One line per action, a Resend with the prompt it resolves to."""
    lines = []
    for action, resolved in zip(actions, _resolve(actions)):
        if isinstance(action, Resend):
            lines.append(action.describe(resolved) if resolved else
                         f"{action.describe()}: no earlier request, nothing")
        else:
            lines.append(action.describe())
    return lines


def _start_call(family: int, length: int, action: Union[Start, Resend]) -> str:
    args = [f"input_ids=explore.prompt_ids({family}, {length})", f"max_new_tokens={action.max_new_tokens}",
            f"ignore_eos={action.ignore_eos}"]
    span = getattr(action, "stop_span", None)
    if action.stop_at is not None and span is not None:
        args.append(f"stop=[texts[{family}, {length}, {action.stop_at}, {span}]]")
    elif action.stop_at is not None:
        args.append(f"stop_token_ids=[stops[{family}, {length}, {action.stop_at}]]")
    args.append("temperature=0.0")
    if action.stream:
        args.append("stream=True")
    if action.logprob_start is not None:
        args.append(f"top_logprobs=2, logprob_start_len={logprob_start_of(action.logprob_start, length)}")
    if getattr(action, "lora", None):
        args.append(f"lora={action.lora!r}")
    if getattr(action, "priority", None) is not None:
        args.append(f"priority={action.priority}")
    return f"reqs.append(ctx.start_req({', '.join(args)}))"


def _stops_wanted(actions: Sequence[Action],
                  prompts: Sequence[Optional[Tuple[int, int]]]) -> List[Tuple[int, int, int]]:
    """The (family, length, k) of every stop token the program's requests use, once each."""
    wanted: List[Tuple[int, int, int]] = []
    for action, prompt in zip(actions, prompts):
        if prompt is None or action.stop_at is None or getattr(action, "stop_span", None) is not None:
            continue
        if (*prompt, action.stop_at) not in wanted:
            wanted.append((*prompt, action.stop_at))
    return wanted


def _stop_texts_wanted(actions: Sequence[Action],
                       prompts: Sequence[Optional[Tuple[int, int]]]) -> List[Tuple[int, int, int, int]]:
    """The (family, length, k, span) of every stop string the program's requests use, once each."""
    wanted: List[Tuple[int, int, int, int]] = []
    for action, prompt in zip(actions, prompts):
        span = getattr(action, "stop_span", None)
        if prompt is not None and action.stop_at is not None and span is not None \
                and (*prompt, action.stop_at, span) not in wanted:
            wanted.append((*prompt, action.stop_at, span))
    return wanted


def _pauses(action: Action) -> bool:
    """Whether the action may leave new requests refused: a pause (the
    tokenizer holds them) or released memory (``ctx`` refuses them)."""
    op = action.op if isinstance(action, (OnWindow, OnPhase)) else action
    return isinstance(op, (Pause, ReleaseMemory))


@dataclass
class Source:
    """A program's source and the line range (1-based, inclusive) of each action."""

    text: str
    action_lines: List[Tuple[int, int]]

    def action_at(self, line: int) -> Optional[int]:
        for i, (lo, hi) in enumerate(self.action_lines):
            if lo <= line <= hi:
                return i
        return None


def to_source(actions: Sequence[Action], *, docstring: str = "", mark: Optional[Dict[int, str]] = None,
              function: str = PROGRAM_FUNCTION) -> Source:
    """The scenario source of ``actions``. ``mark`` maps an action index to a
    comment put after that action's lines (the failing step); index -1 marks
    the end-state checks."""
    mark = mark or {}
    head = []
    if docstring:
        head += ('"""' + docstring.replace('"""', "'''").rstrip() + "\n" + '"""').splitlines()
    head += [
        "from scripted_runtime.scheduler_side.explore import program as explore",
        "",
        "",
        f"def {function}(ctx):",
        "    reqs = []",
    ]
    prompts = resolve_prompts(actions)
    stops = _stops_wanted(actions, prompts)
    if stops:  # resolved before the first action: see program.stop_tokens
        head.append(f"    stops = yield from explore.stop_tokens(ctx, {stops!r})")
    texts = _stop_texts_wanted(actions, prompts)
    if texts:  # the same, for stop strings: program.stop_texts
        head.append(f"    texts = yield from explore.stop_texts(ctx, {texts!r})")
    lines = list(head)
    ranges: List[Tuple[int, int]] = []
    may_be_paused = False
    for i, (action, text) in enumerate(zip(actions, describe_program(actions))):
        lines.append(f"    # {i + 1}. {text}")
        first = len(lines) + 1
        body: List[str]
        if isinstance(action, Steps):
            body = [f"yield from ctx.steps({action.n})"]
        elif isinstance(action, (Start, Resend)) and prompts[i] is None:
            body = ["pass"]
        elif isinstance(action, (Start, Resend)):
            call = _start_call(*prompts[i], action)
            # The tokenizer holds new requests for the whole pause; ctx refuses them while memory is released.
            guards = ["explore.can_start(ctx)"] if may_be_paused else []
            if getattr(action, "lora", None):  # its adapter loaded first, or the request is not sent
                guards.append(f"(yield from explore.ensure_lora(ctx, {action.lora!r}))")
            body = [f"if {' and '.join(guards)}:", "    " + call] if guards else [call]
            if getattr(action, "beside", None) is not None:
                body = [f"yield from explore.join_batch_of(ctx, reqs, {action.beside})"] + body
        elif isinstance(action, ExhaustKv):
            body = _op_lines(action)
        elif isinstance(action, Turn):
            call = (f"yield from explore.session_turn(ctx, reqs, after={action.after!r}, family={action.family}, "
                    f"length={action.input_len}, max_new_tokens={action.max_new_tokens}"
                    + (", stream=True" if action.stream else "") + (", eager=True)" if action.eager else ")"))
            body = ["if explore.can_start(ctx):", "    " + call] if may_be_paused else [call]
        elif isinstance(action, FuzzRequest):
            call = (f"explore.fuzz_request(ctx, reqs, {tuple(action.cases)!r}, family={action.family}, "
                    f"prompt_len={action.prompt_len}, max_new_tokens={action.max_new_tokens})")
            body = ["if explore.can_start(ctx):", "    " + call] if may_be_paused else [call]
        elif isinstance(action, AbortUnknown):
            body = ["explore.abort_unknown(ctx)"]
        elif isinstance(action, ReleaseKv):
            body = ["explore.release_kv(ctx)"]
        elif isinstance(action, Extension):
            body = [f"yield from explore.extension_action(ctx, reqs, {action.name!r})"]
        elif isinstance(action, HoldTransfers):
            body = [f"explore.hold_transfers(ctx, loads={action.loads}, backups={action.backups})"]
        elif isinstance(action, ReleaseTransfers):
            body = ["explore.release_transfers(ctx)"]
        elif isinstance(action, OnWindow):
            body = [f"if (yield from ctx.wait_for_window({action.window!r}, max_steps={action.max_steps}, "
                    "required=False)):"] + ["    " + l for l in _op_lines(action.op)]
        elif isinstance(action, OnPhase):
            body = [f"if (yield from explore.wait_for_phase(ctx, {action.phase!r}, max_steps={action.max_steps})):"
                    ] + ["    " + l for l in _op_lines(action.op)]
        else:
            body = _op_lines(action)
        lines += ["    " + l for l in body]
        if i in mark:
            lines[-1] += f"  # <-- {mark[i]}"
        ranges.append((first, len(lines)))
        may_be_paused = may_be_paused or _pauses(action)
    lines.append("    # end: every request finishes or is aborted, the engine returns to idle")
    lines.append("    return (yield from explore.end_state_checks(ctx, reqs))"
                 + (f"  # <-- {mark[-1]}" if -1 in mark else ""))
    return Source("\n".join(lines) + "\n", ranges)
