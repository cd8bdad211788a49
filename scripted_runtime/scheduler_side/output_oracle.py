"""The greedy-output oracle (scheduler process): what the model must output.

With greedy sampling (``temperature=0``) the output of a request is a
function of its prompt and the weights, not of what else ran beside it:
the same prompt run alone on an idle engine is the reference. So every
greedy request of a program that finished (by length or on a stop token)
must have produced exactly its reference as its own sampling parameters cut
it (``request_contract.expected_output``: after the first stop token, EOS
included unless ``ignore_eos``, else at ``max_new_tokens``), and every
aborted one a prefix of that. A row or KV slot reused while a forward still
reads it (PR 17850, issue 18744), a retract that loses tokens, a chunk that reads
another request's KV: each changes the tokens without crashing anything,
and this is the check that sees it.

A reference is the prompt run alone on the idle engine right after an
accepted flush (so it never reads a prefix a program left in the tree), for
``REFERENCE_TOKENS`` new tokens. References are kept per server process
(one build on one topology) and per weights (a fingerprint of the first
parameters of the driver rank's model), and on disk for every later server
of the same build, engine arguments and checkpoints
(``reference_cache``; ``SCRIPTED_RUNTIME_REFERENCE_CACHE=off`` turns that
off). The explorer computes every prompt
its programs can draw once, right after the server started (``warm``), so a
program never computes one and runs the same steps whatever ran before it;
a scenario replayed on a fresh server computes the ones it needs at its end.

Weights: on the CPU default the server serves the context-sensitive
construction (``user_side/models/construction.py``, seed 0), whose greedy
output depends on every KV entry, and ``ctx.update_weights_from_disk``'s
default path loads the same construction's seed 1, so an update changes
every output. A request posted before a processed update is not compared
(its tokens may come from both); one posted after it is compared with the
references under the new weights (references are keyed by a weights
fingerprint). ``warm`` computes every prompt's reference under both, and
``restore_served_weights`` (run by the explorer around every program) loads
the served weights back after a program that updated them, so every program
starts with the same weights.

Margins: the construction leaves a clear gap between the best and the
second-best logit almost everywhere, but not everywhere, and another batch
composition changes float sums in the last bits (measured: a row of a
``linear`` differs between a batch of one and a batch of several). So a
reference records the margin of each of its tokens (SGLang's top-2
logprobs), and a request is compared only up to the first reference token
whose margin is below ``MARGIN``: past it, either token is a correct greedy
choice.

Greedy is what SGLang stores for ``temperature=0``: ``top_k == 1`` (its
``SamplingParams`` turns temperature 0 into temperature 1 with top-k 1).

Exactness was measured on the CPU default only (float32, dummy weights,
torch_native attention; docs/checks.md, "The output oracle"). On other
devices batch-size-dependent kernels may change the float summation order,
so the oracle compares nothing there (``check_outputs`` returns 0).
"""
from __future__ import annotations

import os
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from scripted_runtime.hooks import sglang_compat
from scripted_runtime.protocol import ENV_CHECKPOINT
from scripted_runtime.scheduler_side import check_registry, reference_cache, state, update_sources
from scripted_runtime.scheduler_side.update_sources import weights_fingerprint
from scripted_runtime.scheduler_side.explore import prompts

# New tokens computed per reference (the explorer asks for at most 12).
REFERENCE_TOKENS = 16
# A reference token whose best logit leads the second by less than this (in logit units;
# the construction's logits spread about 1, float noise of another batch composition is
# about 1e-6) may come out either way: outputs are compared only before it.
MARGIN = 1e-3
REFERENCE_STEPS = 400  # per PP slot: a reference that needs more is an engine fault
GREEDY = 0.0

# (weights fingerprint, prompt) -> (greedy output of REFERENCE_TOKENS or more tokens,
# how many of them lead by at least MARGIN from the first on: the comparable prefix,
# the run's logprobs {"input": one per prompt token, the first None; "output": one per
# output token}, or None where they were not recorded)
_references: Dict[Tuple[Any, Tuple[int, ...]], Tuple[List[int], int, Optional[Dict[str, list]]]] = {}
# references run on this server ("references"), read from the disk cache ("from_cache"), and
# disk caches found to disagree with a reference run again here ("cache_rejected", then not read)
computed = {"references": 0, "from_cache": 0, "cache_rejected": 0}
# this server's reference file (reference_cache), opened at the first reference; None when off
_disk: Dict[str, Any] = {}
# The fingerprint of the weights the server was started with (set by warm).
_served: Dict[str, Any] = {}


class OutputMismatch(AssertionError):
    """A greedy request produced tokens other than its reference's."""


def is_greedy(params: Any) -> bool:
    """SGLang's ``SamplingParams`` as the scheduler holds it: temperature 0
    was turned into ``top_k == 1`` (greedy) by ``__post_init__``."""
    return getattr(params, "top_k", None) == 1


def exact_here(scheduler: Any) -> bool:
    """Whether outputs were measured exact on this engine's device (CPU)."""
    device = getattr(getattr(scheduler, "server_args", None), "device", None)
    return str(device or "cpu") == "cpu"


def _first_difference(output: List[int], reference: Sequence[int]) -> Optional[int]:
    """The first index where ``output`` leaves ``reference``, or None."""
    n = min(len(output), len(reference))
    return next((k for k in range(n) if output[k] != reference[k]), None)


def comparable_prefix(top_logprobs: Optional[Sequence[Sequence[float]]], n: int) -> int:
    """How many of a reference's ``n`` tokens can be compared: up to the
    first whose best logprob leads the second by less than ``MARGIN`` (all
    ``n`` when the margins are unknown: dummy weights, another release)."""
    if not top_logprobs:
        return n
    for i, row in enumerate(top_logprobs[:n]):
        if len(row) >= 2 and row[0] - row[1] < MARGIN:
            return i
    return n


def compare(handle_status: str, output: Sequence[int], expected: Sequence[int], *, cut: str = "",
            comparable: Optional[int] = None) -> Optional[str]:
    """What is wrong with one request's output, or None (pure logic).
    ``expected``: what the request must output in full, its reference as its
    own sampling parameters cut it (``request_contract.expected_output``);
    ``cut`` says where it was cut, for the message ("max_new_tokens=5", "at
    stop token 7"). ``comparable``: how many reference tokens have a clear
    margin (``comparable_prefix``); when ``expected`` reaches past them only
    that prefix is compared (past a token without a clear margin either
    choice is greedy, and so is where a stop token ends the output; the
    request contract still judges the length by the request's own
    parameters)."""
    output = list(output)
    if handle_status not in ("finished", "aborted"):
        return None
    if comparable is not None and comparable < len(expected):
        i = _first_difference(output, list(expected)[:comparable])
        if i is None:
            return None
        return (f"token {i} is {output[i]}, the reference has {expected[i]} "
                f"(output {output[:i + 3]}..., reference {list(expected[:i + 3])}...)")
    i = _first_difference(output, expected)
    if i is not None:
        if handle_status == "finished":
            return (f"token {i} is {output[i]}, the reference has {expected[i]} "
                    f"(output {output[:i + 3]}..., reference {list(expected[:i + 3])}...)")
        return (f"aborted after {len(output)} tokens that are not a prefix of the reference: token {i} is "
                f"{output[i]}, the reference has {expected[i]}")
    where = f" ({cut})" if cut else ""
    if handle_status == "finished" and len(output) != len(expected):
        return (f"finished with {len(output)} tokens, its reference ends after {len(expected)}{where} "
                f"(output {output}, reference {list(expected)})")
    if len(output) > len(expected):
        return (f"aborted after {len(output)} tokens, past the end of its reference after "
                f"{len(expected)}{where}: {output[len(expected):]} emitted after it")
    return None


def comparable_after_updates(posted_step: int, ops: Sequence[Any]) -> bool:
    """Whether a request posted at ``posted_step`` runs under one set of
    weights on KV computed under them (pure logic over the control ops): it
    was posted after the last processed weight update (one posted before it
    may hold tokens of both weights), and, when that update did not flush
    the cache, after a successful flush processed since: the radix tree
    still holds KV computed under the old weights, and a prefix hit reads it
    (SGLang's meaning of ``flush_cache=False``, and of an update whose flush
    was refused because a request was still held: 0.5.23 loads the weights,
    answers ``success=False`` "Weights were updated, but the cache was not
    flushed", and keeps the tree; not a bug)."""
    updates = [op for op in ops if op.name.startswith("update_weights") and op.processed_step is not None]
    if not updates:
        return True
    last = max(updates, key=lambda op: op.processed_step)
    if posted_step <= last.processed_step:
        return False
    if last.payload.get("flush_cache", True) is not False and last.success:
        return True
    return any(op.name == "flush_cache" and op.processed_step is not None and op.success
               and last.processed_step < op.processed_step < posted_step for op in ops)


def cut_of(expected: Sequence[int], *, max_new_tokens: int, ignore_eos: bool, stop_tokens: Iterable[int]) -> str:
    """Where ``expected`` (``request_contract.expected_output``) ends, in
    words, for ``compare``'s messages: on its stop token or at the cap."""
    if expected and not ignore_eos and expected[-1] in set(stop_tokens):
        return f"at stop token {expected[-1]}"
    return f"max_new_tokens={max_new_tokens}"


def lora_tag(ctx: Any, lora: Optional[str]) -> Optional[str]:
    """What identifies LoRA adapter ``lora``'s weights in a reference key:
    the folder name of the harness's adapter of that name (it carries the
    adapters' version and seed); None for the base model, or for an adapter
    the harness does not offer (its weights unknown: not compared)."""
    if lora is None:
        return None
    folder = ctx.lora_adapters.get(lora)
    return os.path.basename(folder.rstrip("/")) if folder else None


def references_key(ctx: Any, lora: Optional[str] = None) -> Any:
    """The weights part of a reference's key: the base weights' fingerprint,
    and the adapter's tag for a request served with a LoRA adapter."""
    fingerprint = weights_fingerprint(ctx.scheduler)
    tag = lora_tag(ctx, lora)
    if tag is None:
        return fingerprint
    # flat (the disk cache stores a fingerprint as one JSON list)
    return tuple(fingerprint or ()) + ("lora", tag)


def reference(ctx: Any, prompt: Tuple[int, ...], n: int, lora: Optional[str] = None):
    """``yield from reference(ctx, prompt, n)``: the greedy output of
    ``prompt`` run alone on the idle engine (at least ``n`` tokens) and its
    comparable prefix (``comparable_prefix``), cached per weights (and per
    LoRA adapter, ``lora``: run with that adapter, loaded first if it is
    not)."""
    entry = yield from reference_entry(ctx, prompt, n, lora)
    return entry[0], entry[1]


def reference_entry(ctx: Any, prompt: Tuple[int, ...], n: int, lora: Optional[str] = None, *, disk: bool = True):
    """``yield from reference_entry(...)``: ``reference``'s (output, comparable
    prefix) and the alone run's logprobs (``_run_alone``), computed or
    cached as ``reference`` does. ``disk=False``: neither read from nor
    written to the disk cache, only this server's memory (a session turn's
    history, computed at the end of the first program that needs it: read
    from the disk on a fresh server, that program's replay there would run
    fewer iterations than it did, and a history replay would not repeat the
    engine's allocations)."""
    key = (references_key(ctx, lora), prompt)
    have = _known(ctx.scheduler, key, disk=disk)
    if have is not None and len(have[0]) >= n:
        return tuple(have) + (None,) * (3 - len(have))  # an entry without logprobs: none recorded
    entry = yield from _run_alone(ctx, prompt, n, lora)
    _references[key] = entry
    computed["references"] += 1
    cache = _disk_cache(ctx.scheduler) if disk else None
    if cache is not None:
        cache.put(key[0], prompt, entry)
    return entry


def _run_alone(ctx: Any, prompt: Tuple[int, ...], n: int, lora: Optional[str] = None):
    """``yield from _run_alone(ctx, prompt, n)``: run ``prompt`` alone on the
    idle engine (with LoRA adapter ``lora``, loaded first if it is not; the
    reset unloads it); its (output, comparable prefix, logprobs: every
    prompt token's input logprob, from the first, and every output token's,
    for the logprob contract). Caches nothing."""
    slots = _slots(ctx)
    yield from ctx.wait_idle(max_steps=60 * slots)
    yield from flush_unseen(ctx, "before a reference run")
    if lora is not None and not (yield from ctx.lora_held(lora, max_steps=REFERENCE_STEPS)):
        raise OutputMismatch(f"LoRA adapter {lora!r} could not be loaded for a reference run (loaded: "
                             f"{', '.join(ctx.loaded_lora_adapters) or 'none'})")
    h = ctx.start_req(input_ids=list(prompt), max_new_tokens=max(n, REFERENCE_TOKENS), ignore_eos=True,
                      temperature=GREEDY, top_logprobs=2, logprob_start_len=0, lora=lora)
    yield from ctx.wait_finished(h, max_steps=REFERENCE_STEPS * slots)
    if h.status != "finished":
        raise OutputMismatch(f"the reference run of a {len(prompt)}-token prompt ended {h.status}, not finished")
    out = h.output_ids
    recorded = sglang_compat.request_logprobs(h.last_req)
    logprobs = None
    if recorded is not None and recorded["input_val"] is not None:
        logprobs = {"input": [None if v is None else float(v) for v in recorded["input_val"]],
                    "output": [float(v) for v in recorded["output_val"]]}
    yield from ctx.wait_idle(max_steps=60 * slots)
    return out, comparable_prefix(h.top_logprobs, len(out)), logprobs


def verify_disk_cache(ctx: Any, prompt: Sequence[int], n: int = REFERENCE_TOKENS):
    """``yield from verify_disk_cache(ctx, prompt)``: before this server reads
    its references from the disk cache, run one of them (``prompt``, under the
    weights loaded now) alone here and compare. The cache's key leaves the
    topology out (a reference measured the same on pp1-overlap, pp1-normal
    and pp4, reference_cache.py), so a server may read what another topology
    computed; if this run disagrees, the disk cache is not read on this
    server again (every reference is computed here) and ``cache_rejected``
    counts it. Returns whether the cache was kept."""
    disk = _disk_cache(ctx.scheduler)
    if disk is None:
        return False
    key = (weights_fingerprint(ctx.scheduler), tuple(prompt))
    if key in _references:
        return True  # computed or checked on this server already
    cached = disk.get(*key)
    if cached is None:
        return True  # nothing to check against: computed here, then written
    live = yield from _run_alone(ctx, tuple(prompt), n)
    computed["references"] += 1
    _references[key] = live
    if [list(live[0][:len(cached[0])]), live[1]] != [list(cached[0][:len(live[0])]), cached[1]]:
        _disk["cache"] = None
        computed["cache_rejected"] += 1
        return False
    return True


def cache_key(scheduler: Any) -> Dict[str, Any]:
    """This server's reference-cache key: ``reference_cache.key_of`` with
    the harness's sources the references depend on (this module's
    comparison rules and reference length, the prompts)."""
    return reference_cache.key_of(scheduler, (__file__, prompts.__file__))


def _disk_cache(scheduler: Any) -> Optional["reference_cache.ReferenceCache"]:
    """This server's reference file, or None when the cache is off (its key
    is computed once per server process)."""
    if "cache" not in _disk:
        directory = reference_cache.cache_dir()
        _disk["cache"] = (reference_cache.ReferenceCache(directory, cache_key(scheduler))
                          if directory is not None else None)
    return _disk["cache"]


def _known(scheduler: Any, key: Tuple[Any, Tuple[int, ...]], *, disk: bool = True
           ) -> Optional[Tuple[List[int], int]]:
    """The reference of ``key`` this server computed or (``disk``) another
    server of its build did (read from the disk cache and kept in memory
    from then on); None when there is none."""
    have = _references.get(key)
    if have is not None or not disk:
        return have
    cache = _disk_cache(scheduler)
    entry = cache.get(*key) if cache is not None else None
    if entry is not None:
        _references[key] = entry
        computed["from_cache"] += 1
    return entry


def _served_weights(ctx: Any) -> Tuple[Optional[str], Optional[str]]:
    """(path, load format) the server was started with, or (None, None)
    when they cannot be reloaded (dummy weights: a reload draws new ones)."""
    args = getattr(ctx.scheduler, "server_args", None)
    path, fmt = getattr(args, "model_path", None), getattr(args, "load_format", None)
    if not path or str(fmt) == "dummy":
        return None, None
    return str(path), str(fmt)


def _load(ctx: Any, path: Optional[str] = None, load_format: Optional[str] = None, why: str = ""):
    op = ctx.update_weights_from_disk(path, flush_cache=True, load_format=load_format, await_arrival=True)
    yield from op.wait(max_steps=20 * max(1, ctx.pp_loop_size))
    if not op.success:
        raise RuntimeError(f"output oracle: loading {path or 'the update checkpoint'} {why} failed: {op}")


def update_source(ctx: Any) -> Tuple[Optional[str], Optional[str]]:
    """(model path, load format) an explored weight update loads: (None,
    None), ``ctx``'s default, the update checkpoint, while the served
    weights are loaded; the served weights once an update replaced them.
    So every update of a program changes the weights, not only its first
    (a second load of the update checkpoint would leave them as they are,
    and a bug that shows only when weights change, a cached checksum or a
    stale weight version, would pass it). Always the default where the
    served weights cannot be reloaded (dummy weights) or were not recorded
    (no warm-up)."""
    served = _served.get("fingerprint")
    if served is None or weights_fingerprint(ctx.scheduler) == served:
        return None, None
    return _served_weights(ctx)


def restore_served_weights(ctx: Any):
    """``yield from restore_served_weights(ctx)``: load the served weights
    back when a weight update changed them (after ``warm`` recorded them);
    returns whether it loaded. The explorer runs it around every program, so
    every program starts with the weights the server was started with."""
    served = _served.get("fingerprint")
    if served is None or weights_fingerprint(ctx.scheduler) == served:
        return False
    path, fmt = _served_weights(ctx)
    if path is None:
        return False
    yield from ctx.wait_idle(max_steps=60 * _slots(ctx))
    yield from _load(ctx, path, fmt, "(the served weights, back after a weight update)")
    return True


def _slots(ctx: Any) -> int:
    """PP microbatch slots (1 without PP): waits scale with them."""
    return max(1, state.mbs_slots(ctx.scheduler))


def flush_unseen(ctx: Any, why: str):
    """``yield from flush_unseen(ctx, why)``: flush the idle engine and wait
    until it was processed, unseen by the control listeners (the explorer's
    coverage counts the program's own operations, not the oracle's). Raises
    when the scheduler refused it."""
    listeners = list(ctx.control_listeners)
    ctx.control_listeners.clear()
    try:
        flush = ctx.flush_cache()
    finally:
        ctx.control_listeners.extend(listeners)
    yield from flush.wait(max_steps=4 * _slots(ctx))
    if not flush.success:
        raise RuntimeError(f"output oracle: the flush {why} was refused on an idle engine "
                           f"({flush.message}); state: {ctx.describe()}")


def warm(ctx, prompt_list: Sequence[Sequence[int]], n: int = REFERENCE_TOKENS, with_update: bool = True,
         lora_prompts: Sequence[Sequence[int]] = ()):
    """A script: compute the reference of every prompt under the served
    weights and, with ``with_update``, under the weights a default
    ``update_weights_from_disk`` loads, then load the served ones back
    (``scripted-runtime explore`` runs it once per server before any
    program; on a LoRA server also each adapter's references of
    ``lora_prompts``). Returns how many it computed (``references``), how many it
    read from the disk cache (``from_cache``), and whether it found the disk
    cache disagreeing with a reference run here and stopped reading it
    (``cache_rejected``, ``verify_disk_cache``). A server serving dummy weights
    (the GPU default) computes them under the update's weights only, as
    before: its programs run after one update."""
    before = dict(computed)
    path, fmt = _served_weights(ctx)
    if lora_prompts and path is not None:
        # a LoRA server: each adapter's references of the prompts its requests draw, under the served
        # weights (a program updating them computes the ones it needs at its end). Each adapter is
        # first served once in the same order whether its references are cached or not, so the LoRA
        # memory pool has the same history after this on every server of a build: a build whose
        # outputs depend on that history (a slot keeping an evicted adapter's weights) then fails a
        # program the same way on the server that found it and on a fresh one.
        yield from restore_served_weights(ctx)
        for name in sorted(ctx.lora_adapters):
            yield from _run_alone(ctx, tuple(lora_prompts[0]), 1, name)
        for name in sorted(ctx.lora_adapters):
            for prompt in lora_prompts:
                yield from reference(ctx, tuple(prompt), n, name)
    if path is None:  # dummy weights: every program runs under the update checkpoint's
        if with_update:
            yield from _load(ctx, why="before the references")
        for prompt in prompt_list:
            yield from reference(ctx, tuple(prompt), n)
        return {k: computed[k] - before[k] for k in computed}
    _served.setdefault("fingerprint", weights_fingerprint(ctx.scheduler))
    yield from restore_served_weights(ctx)
    update_sources.note_loaded(path, _served["fingerprint"])
    if prompt_list:
        yield from verify_disk_cache(ctx, prompt_list[-1], n)
    for prompt in prompt_list:
        yield from reference(ctx, tuple(prompt), n)
    if with_update and os.environ.get(ENV_CHECKPOINT) not in (None, "", path):
        yield from _load(ctx, why="(the update checkpoint, for its references)")
        update_sources.note_loaded(os.environ.get(ENV_CHECKPOINT), weights_fingerprint(ctx.scheduler))
        for prompt in prompt_list:
            yield from reference(ctx, tuple(prompt), n)
        yield from restore_served_weights(ctx)
    return {k: computed[k] - before[k] for k in computed}


def cached_reference(ctx: Any, prompt: Sequence[int]) -> Optional[Tuple[List[int], int]]:
    """The reference of ``prompt`` under the weights loaded now, if it was
    computed on this server or is in the disk cache; None otherwise (never
    computes one)."""
    entry = _known(ctx.scheduler, (weights_fingerprint(ctx.scheduler), tuple(prompt)))
    return None if entry is None else (entry[0], entry[1])


def references_wanted(ctx: Any) -> bool:
    """Whether this script compares outputs with references: the check is on
    and outputs are exact on this device (``exact_here``)."""
    return ctx.check_enabled("greedy_output") and exact_here(ctx.scheduler)


@check_registry.end_check("greedy_output", doc="every greedy request that finished output its reference's "
                                                "tokens, cut at its first stop token or its length cap; an "
                                                "aborted one a prefix of them")
def check_outputs(ctx: Any, handles: Sequence[Any]):
    """``yield from check_outputs(ctx, handles)``: every greedy handle that
    finished by length or on a stop token equals its reference cut as its
    sampling parameters end it (``request_contract.expected_output``); every
    aborted one is a prefix of that. Raises ``OutputMismatch`` naming the
    request and the first differing token. Returns how many were compared."""
    # imported here: at module level it would register its end check before this one
    from scripted_runtime.scheduler_side import request_contract

    if not exact_here(ctx.scheduler):
        return 0
    todo = []
    for h in handles:
        status = h.status
        if status not in ("finished", "aborted"):
            continue
        req = h.last_req
        params = getattr(req, "sampling_params", None) if req is not None else None
        prompt = tuple(getattr(req, "origin_input_ids", ()) or ()) if req is not None else ()
        turn = getattr(h, "expected_prompt", None) is not None and (status == "finished"
                                                                  or tuple(h.expected_prompt) == prompt)
        if turn:
            # a session turn: its whole history as the client's conversation makes it, not as SGLang
            # recorded it (a history SGLang built wrong must show as a mismatch). Not a turn SGLang
            # aborted with another prompt: refused at ingest (its session closed or closing, the turn
            # it continues unfinished), it ran SGLang's placeholder prompt, judged as any such abort
            prompt = tuple(h.expected_prompt)
        ends = request_contract.params_of(h)  # (max_new_tokens, ignore_eos, stop tokens) as SGLang matches them
        if not prompt or not is_greedy(params) or ends is None or ends[0] is None:
            continue
        lora = getattr(h, "lora", None)
        if lora is not None and lora_tag(ctx, lora) is None:
            continue  # an adapter the harness does not offer: its weights (and references) unknown
        if status == "finished" and h.finish_reason not in ("FINISH_LENGTH", "FINISH_MATCHED_TOKEN"):
            continue  # a stop string (or a grammar) ends it where only the tokenizer can tell
        todo.append((h, status, prompt, ends, turn))
    todo = [t for t in todo if comparable_after_updates(t[0].posted_step, ctx.control_ops)]
    compared = 0
    for h, status, prompt, (max_new, ignore_eos, stops), turn in todo:
        lora = getattr(h, "lora", None)
        answer = request_contract.answer_of(h.last_req)  # what the client is sent: cut at finished_len
        output = answer["output_ids"] if answer is not None else h.output_ids
        if not output and status == "aborted":
            continue
        # a turn's history: this server's memory only (reference_entry); every other prompt may come
        # from the disk cache, as the warm-up's do
        ref, comparable, logprobs = yield from reference_entry(ctx, prompt, max(len(output), max_new), lora,
                                                               disk=not turn)
        expected = request_contract.expected_output(ref, max_new_tokens=max_new, ignore_eos=ignore_eos,
                                                    stop_tokens=stops)
        problem = compare(status, output, expected, comparable=comparable,
                          cut=cut_of(expected, max_new_tokens=max_new, ignore_eos=ignore_eos, stop_tokens=stops))
        compared += 1
        if problem:
            hint = yield from chunk_hint(ctx, prompt, output, expected, h.extend_ends)
            words = f", a turn of session {h.session!r}: its history as the client's conversation makes it" if turn else ""
            chunks = ", prefilled in chunks" if was_chunked(ctx.batch_log, h.rid) else ""
            raise OutputMismatch(f"request {h.rid} ({prompts.describe(prompt)}{words}{chunks}, {status}): "
                                 f"{problem}{hint}")
        # what it was compared with, for the logprob contract: its first `compared` tokens are the reference's
        h.oracle_reference = {"compared": min(len(output), comparable), "logprobs": logprobs}
    return compared


def was_chunked(batch_log: Sequence[Any], rid: str) -> bool:
    """Whether a forward of this run launched while ``rid`` was the
    scheduler's chunked request (``BatchRecord.chunked_rid``: a prefill of it
    split into chunks, first or after a retraction). A mismatch names it
    (``prefilled in chunks``): a bug that commits a non-final chunk's
    prediction can only reach such a request (the registry's
    ``pp_retract_chunk_duplicate_token`` needs it)."""
    return any(rec.chunked_rid == rid for rec in batch_log)


def chunk_hint(ctx: Any, prompt: Sequence[int], output: Sequence[int], expected: Sequence[int],
               extend_ends: Sequence[int] = ()):
    """``yield from chunk_hint(...)``: when a chunked prompt's first output
    token is wrong, whether it is the greedy token of the prompt cut at a
    chunk boundary (a non-final chunk's prediction committed as the
    request's token), as words for the mismatch message; "" otherwise.
    The boundaries are those the request's extends had as SGLang scheduled
    them (``extend_ends``: a chunk shares its budget with the batch's other
    requests, a recompute after a retract starts from its cached prefix),
    then the multiples of ``chunked_prefill_size``. Computes those cut
    prompts' references (only after a mismatch)."""
    if not output or not expected or output[0] == expected[0]:
        return ""
    size = int(getattr(getattr(ctx.scheduler, "server_args", None), "chunked_prefill_size", 0) or 0)
    cuts = [end for end in extend_ends if 0 < end < len(prompt)]
    if size > 0:
        cuts += range(size, len(prompt), size)
    for cut in dict.fromkeys(cuts):
        ref, _ = yield from reference(ctx, tuple(prompt[:cut]), 1)
        if ref and ref[0] == output[0]:
            return f"; token 0 is what the first {cut} prompt tokens predict: a non-final chunk's token"
    return ""
