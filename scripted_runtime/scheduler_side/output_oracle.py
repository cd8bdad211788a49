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
parameters of the driver rank's model). The explorer computes every prompt
its programs can draw once, right after the server started (``warm``), so a
program never computes one and runs the same steps whatever ran before it;
a scenario replayed on a fresh server computes the ones it needs at its end.

Weights: ``update_weights_from_disk`` loads new weights, so a request
posted before a processed update is not compared (its tokens may come from
both). On the CPU default the server starts with dummy (random) weights and
an update loads the harness's small checkpoint file instead (``ctx.
update_weights_from_disk``'s default path), so the first update changes
every output (measured on 0.5.23: an 8-token prompt of token 1 gave [37, 1,
37, ...] before it and [8, 429, 508, ...] after it), and every later update
loads the same file again. ``warm`` therefore loads the weights once before
computing the references: from then on every program starts with the
weights any update loads, whatever the programs before it did.

Greedy is what SGLang stores for ``temperature=0``: ``top_k == 1`` (its
``SamplingParams`` turns temperature 0 into temperature 1 with top-k 1).

Exactness was measured on the CPU default only (float32, dummy weights,
torch_native attention; docs/checks.md, "The output oracle"). On other
devices batch-size-dependent kernels may change the float summation order,
so the oracle compares nothing there (``check_outputs`` returns 0).
"""
from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from scripted_runtime.scheduler_side import check_registry
from scripted_runtime.scheduler_side.explore import prompts

# New tokens computed per reference (the explorer asks for at most 12).
REFERENCE_TOKENS = 16
REFERENCE_STEPS = 400  # per PP slot: a reference that needs more is an engine fault
GREEDY = 0.0

# (weights fingerprint, prompt) -> greedy output of REFERENCE_TOKENS (or more) tokens
_references: Dict[Tuple[Any, Tuple[int, ...]], List[int]] = {}
computed = {"references": 0}


class OutputMismatch(AssertionError):
    """A greedy request produced tokens other than its reference's."""


def weights_fingerprint(scheduler: Any) -> Any:
    """A few numbers that change when the weights do: sums of the first 64
    values of the first three parameters of this rank's model (None when
    the model cannot be found)."""
    try:
        model = scheduler.tp_worker.model_runner.model
        params = list(zip(range(3), model.named_parameters()))
    except Exception:  # noqa: BLE001 - another release's layout: one key for all weights
        return None
    return tuple(round(float(p.detach().reshape(-1)[:64].double().sum()), 6) for _, (_, p) in params)


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


def compare(handle_status: str, output: Sequence[int], expected: Sequence[int], *, cut: str = "") -> Optional[str]:
    """What is wrong with one request's output, or None (pure logic).
    ``expected``: what the request must output in full, its reference as its
    own sampling parameters cut it (``request_contract.expected_output``);
    ``cut`` says where it was cut, for the message ("max_new_tokens=5", "at
    stop token 7")."""
    output = list(output)
    if handle_status not in ("finished", "aborted"):
        return None
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


def cut_of(expected: Sequence[int], *, max_new_tokens: int, ignore_eos: bool, stop_tokens: Iterable[int]) -> str:
    """Where ``expected`` (``request_contract.expected_output``) ends, in
    words, for ``compare``'s messages: on its stop token or at the cap."""
    if expected and not ignore_eos and expected[-1] in set(stop_tokens):
        return f"at stop token {expected[-1]}"
    return f"max_new_tokens={max_new_tokens}"


def reference(ctx: Any, prompt: Tuple[int, ...], n: int):
    """``yield from reference(ctx, prompt, n)``: the greedy output of
    ``prompt`` run alone on the idle engine (at least ``n`` tokens), cached."""
    key = (weights_fingerprint(ctx.scheduler), prompt)
    have = _references.get(key)
    if have is not None and len(have) >= n:
        return have
    from scripted_runtime.scheduler_side import state

    slots = max(1, state.mbs_slots(ctx.scheduler))
    yield from ctx.wait_idle(max_steps=60 * slots)
    yield from flush_unseen(ctx, "before a reference run")
    h = ctx.start_req(input_ids=list(prompt), max_new_tokens=max(n, REFERENCE_TOKENS), ignore_eos=True,
                      temperature=GREEDY)
    yield from ctx.wait_finished(h, max_steps=REFERENCE_STEPS * slots)
    if h.status != "finished":
        raise OutputMismatch(f"the reference run of a {len(prompt)}-token prompt ended {h.status}, not finished")
    out = h.output_ids
    _references[key] = out
    computed["references"] += 1
    yield from ctx.wait_idle(max_steps=60 * slots)
    return out


def flush_unseen(ctx: Any, why: str):
    """``yield from flush_unseen(ctx, why)``: flush the idle engine and wait
    until it was processed, unseen by the control listeners (the explorer's
    coverage counts the program's own operations, not the oracle's). Raises
    when the scheduler refused it."""
    from scripted_runtime.scheduler_side import state

    listeners = list(ctx.control_listeners)
    ctx.control_listeners.clear()
    try:
        flush = ctx.flush_cache()
    finally:
        ctx.control_listeners.extend(listeners)
    yield from flush.wait(max_steps=4 * max(1, state.mbs_slots(ctx.scheduler)))
    if not flush.success:
        raise RuntimeError(f"output oracle: the flush {why} was refused on an idle engine "
                           f"({flush.message}); state: {ctx.describe()}")


def warm(ctx, prompts: Sequence[Sequence[int]], n: int = REFERENCE_TOKENS, reload_weights: bool = True):
    """A script: reload the weights (see the module docstring), then compute
    the reference of every prompt (``scripted-runtime explore`` runs it once
    per server before any program). Returns how many it computed."""
    before = computed["references"]
    if reload_weights:
        op = ctx.update_weights_from_disk(flush_cache=True, await_arrival=True)
        yield from op.wait(max_steps=20 * max(1, ctx.pp_loop_size))
        if not op.success:
            raise RuntimeError(f"output oracle: reloading the weights before the references failed: {op}")
    for prompt in prompts:
        yield from reference(ctx, tuple(prompt), n)
    return computed["references"] - before


def cached_reference(ctx: Any, prompt: Sequence[int]) -> Optional[List[int]]:
    """The reference of ``prompt`` under the weights loaded now, if it was
    computed on this server; None otherwise (never computes one)."""
    return _references.get((weights_fingerprint(ctx.scheduler), tuple(prompt)))


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
        ends = request_contract.params_of(h)  # (max_new_tokens, ignore_eos, stop tokens) as SGLang matches them
        if not prompt or not is_greedy(params) or ends is None or ends[0] is None:
            continue
        if status == "finished" and h.finish_reason not in ("FINISH_LENGTH", "FINISH_MATCHED_TOKEN"):
            continue  # a stop string (or a grammar) ends it where only the tokenizer can tell
        todo.append((h, status, prompt, ends))
    updates = [op.processed_step for op in ctx.control_ops
               if op.name.startswith("update_weights") and op.processed_step is not None]
    if updates:  # a request posted before a weight update may hold tokens of both weights
        todo = [t for t in todo if t[0].posted_step > max(updates)]
    compared = 0
    for h, status, prompt, (max_new, ignore_eos, stops) in todo:
        answer = request_contract.answer_of(h.last_req)  # what the client is sent: cut at finished_len
        output = answer["output_ids"] if answer is not None else h.output_ids
        if not output and status == "aborted":
            continue
        ref = yield from reference(ctx, prompt, max(len(output), max_new))
        expected = request_contract.expected_output(ref, max_new_tokens=max_new, ignore_eos=ignore_eos,
                                                    stop_tokens=stops)
        problem = compare(status, output, expected, cut=cut_of(expected, max_new_tokens=max_new,
                                                                ignore_eos=ignore_eos, stop_tokens=stops))
        compared += 1
        if problem:
            raise OutputMismatch(f"request {h.rid} ({prompts.describe(prompt)}, {status}): {problem}")
    return compared
