"""Blind mutant set 4: SGLang 0.5.23's scheduler-side logprob path.

Kept as external patches, like the third blind set; run one with, for example:

    scripted-runtime mutate --topology pp1-normal --no-corpus \
        --patch bench/blind_mutants/blind4_logprobs.py:blind4_chunk_edge_target_dropped

Written by a helper author in one sitting on 2026-11-27; not edited since.

Written from SGLang's own source only, without reading the harness's checks,
explorer, corpus, tests or check docs. Each mutant is a ``Patch`` whose
``install(scheduler_module)`` monkeypatches one spot of SGLang's handling of
``return_logprob`` requests (input logprobs from ``logprob_start_len``, output
logprobs, ``top_logprobs_num`` rows, ``token_ids_logprob`` rows) by wrapping
the original (``__wrapped__`` keeps it). They are spread over five spots: the
prefix-match cap for logprob requests (``Req._compute_max_prefix_len``), the
input-logprob target ids of a prefill batch (``ScheduleBatch.prepare_for_extend``),
the batch merge's per-request logprob settings (``ScheduleBatch.merge_batch``),
decode result processing (``SchedulerBatchResultProcessor._apply_decode_logprobs``)
and the output streamer (``_GenerationStreamAccumulator.accept``).

Every install raises ``PatchError`` ("... written against SGLang 0.5.23") when
its target is missing. None uses randomness or timing, and every one leaves a
request that does not ask for logprobs exactly as it was (the server's
warm-up request is a single ``/generate`` of "The capital city of France is"
with temperature 0 and max_new_tokens 8, and no return_logprob). Only
``blind4_start_zero_prefix_uncapped`` is one that SGLang's own assertions
catch (a scheduler crash); the others give silently wrong logprob output.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from scripted_runtime.hooks.mutants.base import (
    find_attr,
    find_method,
    find_module,
    replace_attr,
)
from scripted_runtime.hooks.patch_base import Patch, PatchError

RELEASE = "0.5.23"
ALL = ("pp1-overlap", "pp1-normal", "pp4")

SCHEDULE_BATCH = "sglang.srt.managers.schedule_batch"
BATCH_RESULT_PROCESSOR = "sglang.srt.managers.scheduler_components.batch_result_processor"
OUTPUT_STREAMER = "sglang.srt.managers.scheduler_components.output_streamer"


# --- 1. prefix match: logprob_start_len=0 is not a cap (truthiness slip) -------------


def _install_start_zero_prefix_uncapped(scheduler_module: Any) -> None:
    """A logprob request's prefix-cache match is capped only for a truthy ``logprob_start_len``.

    The bug: ``Req._compute_max_prefix_len`` caps the radix-cache match of a
    logprob request so that every position from ``logprob_start_len`` on is
    recomputed (its logprobs are needed)::

        if self.return_logprob and self.logprob_start_len >= 0:
            max_prefix_len = min(max_prefix_len, self.logprob_start_len)

    The mutant behaves as if the condition read
    ``if self.return_logprob and self.logprob_start_len:``: a start of 0 (all
    prompt logprobs, the most common explicit value) is falsy, so the match is
    not capped; a start of -1 (kept by SGLang for a logprob request that gives
    ``token_ids_logprob`` and no start) is truthy, so its match is capped to
    nothing. Implemented by running the original with the cap disabled and
    applying the cap under the truthy test.

    Why plausible: ``if x.logprob_start_len:`` reads as "a start was given",
    and the -1/0 sentinel pair is a classic truthiness trap.

    Trigger: a request with return_logprob=True and logprob_start_len=0 whose
    prompt shares a cached prefix (the same prompt sent twice, a shared system
    prompt, or a retracted request re-prefilled). A start > 0, the default
    start, and requests without logprobs are unaffected; a request with
    token_ids_logprob and no start loses its prefix-cache hit (cached_tokens 0,
    output unchanged).

    Seen by (written blind): the prefill only computes logprobs for the
    uncached tail, so the input logprobs are shorter than the prompt and
    SGLang's own length assertion in ``add_input_logprob_return_values``
    raises in the scheduler: the server dies, every in-flight request is lost.
    Before that (token_ids_logprob without a start): cached_tokens 0 where a
    prefix-cache hit is expected.
    """
    name = "blind4_start_zero_prefix_uncapped"
    batch_module = find_module(SCHEDULE_BATCH, name)
    req_cls = find_attr(batch_module, "Req", name, f"{SCHEDULE_BATCH}.Req")
    original = find_method(req_cls, "_compute_max_prefix_len", name, ("input_len",))
    find_method(req_cls, "init_next_round_input", name)

    def _compute_max_prefix_len(self, input_len):
        if not self.return_logprob:
            return original(self, input_len)
        start = self.logprob_start_len
        self.logprob_start_len = -1  # the original applies no logprob cap for -1
        try:
            max_prefix_len = original(self, input_len)
        finally:
            self.logprob_start_len = start
        if start:  # MUTANT: `and self.logprob_start_len:` instead of `>= 0` (0 is falsy, -1 truthy)
            max_prefix_len = max(min(max_prefix_len, start), 0)
        return max_prefix_len

    _compute_max_prefix_len.__name__ = _compute_max_prefix_len.__qualname__ = "_compute_max_prefix_len"
    replace_attr(req_cls, "_compute_max_prefix_len", _compute_max_prefix_len, original)


blind4_start_zero_prefix_uncapped = Patch(
    name="blind4_start_zero_prefix_uncapped",
    summary="the prefix-cache match of a logprob request is not capped when logprob_start_len is 0 "
            "(truthiness test), so a cached prompt prefix skips its input logprobs",
    install=_install_start_zero_prefix_uncapped,
    topologies=ALL,
    expected="unknown (written blind): a scheduler crash on SGLang's input-logprob length assertion when "
             "a logprob_start_len=0 request hits the prefix cache",
)


# --- 2. chunked prefill: the last position of a chunk scores the pad token -----------


def _install_chunk_edge_target_dropped(scheduler_module: Any) -> None:
    """The input logprob computed at the last position of a non-final chunk targets token 0.

    The bug: ``ScheduleBatch.prepare_for_extend`` builds
    ``extend_input_logprob_token_ids``, the token whose logprob each computed
    position scores (the *next* token, hence the shift by one)::

        logprob_token_ids = req.origin_input_ids[global_start_idx + 1 : global_end_idx + 1]

    and pads the rest of the request's span with 0 ("it can also overflow").
    The mutant behaves as if the slice stopped at ``global_end_idx`` (the end
    of this chunk's fill): the last computed position of a chunk that does not
    reach the end of the prompt scores pad token 0 instead of the first token
    of the next chunk. The final chunk is unchanged (there the token past the
    fill is past the prompt, and its value is dropped anyway). Implemented by
    wrapping the method and zeroing that entry of each such request's span.

    Why plausible: "the next token after the fill" looks like an out-of-bounds
    read that the zero padding exists for; clamping the slice to the fill is
    a natural "fix", and unchunked prompts (every short test) are unaffected.

    Trigger: a request with return_logprob=True and a logprob_start_len
    before the end of a non-final chunk of its prompt (logprob_start_len 0 and
    a prompt of more than 64 tokens with 64-token chunks, not served from the
    prefix cache past that chunk). Unchunked prompts, the default start
    (output logprobs only), and requests without logprobs are unaffected.

    Seen by (written blind): ``input_token_logprobs`` keeps its length and its
    token ids, but the entry for the first token of every later chunk (e.g.
    index 64 - logprob_start_len) holds the logprob of token 0 at that
    position, not of the prompt token: one wrong value per chunk boundary,
    differing from an unchunked run of the same prompt. Top-k rows, output
    logprobs and the generated text are unchanged.
    """
    name = "blind4_chunk_edge_target_dropped"
    batch_module = find_module(SCHEDULE_BATCH, name)
    batch_cls = find_attr(batch_module, "ScheduleBatch", name, f"{SCHEDULE_BATCH}.ScheduleBatch")
    original = find_method(batch_cls, "prepare_for_extend", name)
    find_attr(batch_module, "compute_extend_logprob_start_len", name,
              f"{SCHEDULE_BATCH}.compute_extend_logprob_start_len")
    fields = {f.name for f in dataclasses.fields(batch_cls)} if dataclasses.is_dataclass(batch_cls) else set()
    wanted = ("extend_input_logprob_token_ids", "extend_logprob_start_lens", "prefix_lens", "extend_lens")
    if any(field not in fields for field in wanted):
        raise PatchError(f"mutant {name}: ScheduleBatch fields {', '.join(wanted)} not found: "
                         f"this mutant is written against SGLang {RELEASE}")

    def prepare_for_extend(self):
        ret = original(self)
        token_ids = getattr(self, "extend_input_logprob_token_ids", None)
        if not self.return_logprob or token_ids is None:
            return ret
        starts, prefix_lens, extend_lens = self.extend_logprob_start_lens, self.prefix_lens, self.extend_lens
        offset, edges = 0, []
        for i, req in enumerate(self.reqs):
            span = extend_lens[i] - starts[i]
            if (
                span > 0
                and req.return_logprob
                and req.logprob_start_len >= 0
                and prefix_lens[i] + extend_lens[i] < len(req.origin_input_ids)
            ):
                # MUTANT: origin_input_ids[start + 1 : end] -- the next chunk's first token is padded
                edges.append(offset + span - 1)
            offset += max(span, 0)
        if offset != token_ids.numel():
            return ret  # not the 0.5.23 layout (e.g. an encoder-decoder batch): leave it alone
        for pos in edges:
            token_ids[pos] = 0
        return ret

    prepare_for_extend.__name__ = prepare_for_extend.__qualname__ = "prepare_for_extend"
    replace_attr(batch_cls, "prepare_for_extend", prepare_for_extend, original)


blind4_chunk_edge_target_dropped = Patch(
    name="blind4_chunk_edge_target_dropped",
    summary="at the last position of a non-final prefill chunk the input logprob is computed for pad "
            "token 0 instead of the next prompt token (one wrong input logprob per chunk boundary)",
    install=_install_chunk_edge_target_dropped,
    topologies=ALL,
    expected="unknown (written blind): wrong input_token_logprobs values (right length and ids) at chunk "
             "boundaries of a chunked prompt with logprob_start_len before the boundary",
)


# --- 3. batch merge: logprob settings padded on the wrong side ------------------------


def _install_merge_logprob_pad_swapped(scheduler_module: Any) -> None:
    """Merging a logprob prefill batch into a running batch without logprobs misaligns the per-request settings.

    The bug: ``ScheduleBatch.merge_batch`` keeps ``top_logprobs_nums`` and
    ``token_ids_logprobs`` aligned with ``reqs`` (``self.reqs + other.reqs``);
    when only ``other`` returns logprobs it pads ``self``'s side::

        elif other.return_logprob:
            self.top_logprobs_nums = [0] * len(self.reqs) + other.top_logprobs_nums
            self.token_ids_logprobs = [None] * len(self.reqs) + other.token_ids_logprobs

    The mutant pads after ``other``'s entries instead
    (``other.top_logprobs_nums + [0] * len(self.reqs)``, likewise for
    ``token_ids_logprobs``), as a copy of the ``elif self.return_logprob``
    branch above it would. The lengths still match, so nothing complains; the
    misalignment survives later ``filter_batch`` calls.

    Why plausible: the three branches are near copies of one another, and the
    wrong-side padding has the right length.

    Trigger: a request with return_logprob=True and top_logprobs_num > 0 (or
    token_ids_logprob) admitted while the running batch holds only requests
    that do not ask for logprobs (e.g. a long request without logprobs is
    decoding when the logprob request arrives). Requests sent together (one
    prefill batch), or into a running batch that already has a logprob
    request, are unaffected; so is everything without logprobs.

    Seen by (written blind): from its second output token on, the logprob
    request's decode steps use another row's settings: its
    ``output_top_logprobs`` rows are empty (None per token after the first)
    or have the wrong number of entries, and its ``output_token_ids_logprobs``
    rows are empty/None. Output token logprobs and text stay right.
    """
    name = "blind4_merge_logprob_pad_swapped"
    batch_module = find_module(SCHEDULE_BATCH, name)
    batch_cls = find_attr(batch_module, "ScheduleBatch", name, f"{SCHEDULE_BATCH}.ScheduleBatch")
    original = find_method(batch_cls, "merge_batch", name, ("other",))

    def merge_batch(self, other):
        self_logprob, other_logprob = self.return_logprob, other.return_logprob
        ret = original(self, other)
        if other_logprob and not self_logprob:
            num_self = len(self.reqs) - len(other.reqs)
            if (
                num_self > 0
                and other.top_logprobs_nums is not None
                and other.token_ids_logprobs is not None
            ):
                # MUTANT: padded after other's entries instead of before them
                self.top_logprobs_nums = list(other.top_logprobs_nums) + [0] * num_self
                self.token_ids_logprobs = list(other.token_ids_logprobs) + [None] * num_self
        return ret

    merge_batch.__name__ = merge_batch.__qualname__ = "merge_batch"
    replace_attr(batch_cls, "merge_batch", merge_batch, original)


blind4_merge_logprob_pad_swapped = Patch(
    name="blind4_merge_logprob_pad_swapped",
    summary="merge_batch pads top_logprobs_nums/token_ids_logprobs on the wrong side when only the new "
            "batch returns logprobs: merged logprob requests decode with another row's top-k settings",
    install=_install_merge_logprob_pad_swapped,
    topologies=ALL,
    expected="unknown (written blind): empty/None (or wrongly sized) output top-logprob and "
             "token_ids_logprob rows for a logprob request admitted into a running batch without logprobs",
)


# --- 4. decode: the finishing token's logprobs are not recorded ---------------------


def _install_finishing_token_logprob_dropped(scheduler_module: Any) -> None:
    """The decode step that finishes a request does not record that token's logprobs.

    The bug: ``process_batch_result_decode`` appends the new token, updates
    the finish state, handles a finished request
    (``_handle_finish_state_updated_req``) and then, for a logprob request,
    records the token's logprob, top-k row and token_ids row with
    ``_apply_decode_logprobs``. The mutant behaves as if that call were
    guarded by ``if req.return_logprob and not req.finished():`` (implemented
    by wrapping ``_apply_decode_logprobs`` and returning early for a finished
    request), so the token on which a request finishes during decode gets no
    logprob entries.

    Why plausible: the loop already skips finished requests under overlap
    (``if ... (req.finished() or req.is_retracted): continue``), and "a
    finished request needs no more bookkeeping" is an easy belief once its KV
    was released a few lines above.

    Trigger: any request with return_logprob=True that finishes in a decode
    step (max_new_tokens >= 2, finishing by length, EOS, stop token or stop
    string). A request finishing on its first token (in prefill) and requests
    without logprobs are unaffected.

    Seen by (written blind): ``output_token_logprobs`` (and
    ``output_top_logprobs`` / ``output_token_ids_logprobs``) has one entry
    fewer than the completion tokens: the last generated token has none
    (in a stream, the final chunk carries no logprobs for its token).
    """
    name = "blind4_finishing_token_logprob_dropped"
    processor_module = find_module(BATCH_RESULT_PROCESSOR, name)
    cls = find_attr(processor_module, "SchedulerBatchResultProcessor", name,
                    f"{BATCH_RESULT_PROCESSOR}.SchedulerBatchResultProcessor")
    original = find_method(cls, "_apply_decode_logprobs", name, ("req", "i", "batch", "next_token_id"))
    find_method(cls, "process_batch_result_decode", name)

    def _apply_decode_logprobs(self, *args, **kwargs):
        req = kwargs.get("req", args[0] if args else None)
        if req is not None and req.finished():
            return None  # MUTANT: the finishing token's logprobs are not recorded
        return original(self, *args, **kwargs)

    _apply_decode_logprobs.__name__ = _apply_decode_logprobs.__qualname__ = "_apply_decode_logprobs"
    replace_attr(cls, "_apply_decode_logprobs", _apply_decode_logprobs, original)


blind4_finishing_token_logprob_dropped = Patch(
    name="blind4_finishing_token_logprob_dropped",
    summary="the decode step that finishes a logprob request records no logprob/top-k/token_ids entry "
            "for its last token",
    install=_install_finishing_token_logprob_dropped,
    topologies=ALL,
    expected="unknown (written blind): output logprob lists one entry shorter than the completion tokens "
             "for any logprob request that finishes in decode",
)


# --- 5. output streamer: input logprobs are re-sent until the request finishes --------


def _install_stream_input_logprobs_resent(scheduler_module: Any) -> None:
    """Input logprobs are marked as sent only in a request's final output.

    The bug: ``_GenerationStreamAccumulator.accept`` sends a request's input
    (prompt) logprobs once, in the first output after its prefill, and sets
    ``req.input_logprob_sent = True``. The mutant sets the flag only when the
    output is the request's last (``if req.finished(): req.input_logprob_sent =
    True``), so every intermediate output carries the whole input-logprob
    lists again. Implemented by wrapping ``accept`` and clearing the flag
    again after an output of an unfinished request.

    Why plausible: a change that defers "sent" bookkeeping to the final output
    (as the finished-output flags are) looks harmless for non-streaming
    requests, which the simple tests use; the receiver extends rather than
    replaces, so nothing fails loudly.

    Trigger: a request with return_logprob=True, input logprobs (a
    logprob_start_len before the end of the prompt) and more than one output:
    stream=True with two or more generated tokens, or a non-streaming request
    long enough to be flushed at the forced stream interval (50 tokens).
    Single-output requests, the default start (no input logprobs), and
    requests without logprobs are unaffected.

    Seen by (written blind): the tokenizer manager appends each copy, so the
    client's ``input_token_logprobs`` (and ``input_top_logprobs`` /
    ``input_token_ids_logprobs``) is the prompt's list repeated once per
    output chunk: too long by a multiple of the prompt length, in a stream
    growing chunk after chunk.
    """
    name = "blind4_stream_input_logprobs_resent"
    streamer_module = find_module(OUTPUT_STREAMER, name)
    cls = find_attr(streamer_module, "_GenerationStreamAccumulator", name,
                    f"{OUTPUT_STREAMER}._GenerationStreamAccumulator")
    original = find_method(cls, "accept", name, ("req",))
    find_attr(streamer_module, "SchedulerOutputStreamer", name, f"{OUTPUT_STREAMER}.SchedulerOutputStreamer")

    def accept(self, *, req):
        was_sent = req.input_logprob_sent
        ret = original(self, req=req)
        if req.return_logprob and not was_sent and req.input_logprob_sent and not req.finished():
            req.input_logprob_sent = False  # MUTANT: only the final output marks them sent
        return ret

    accept.__name__ = accept.__qualname__ = "accept"
    replace_attr(cls, "accept", accept, original)


blind4_stream_input_logprobs_resent = Patch(
    name="blind4_stream_input_logprobs_resent",
    summary="input logprobs are marked sent only in a request's final output, so every earlier output "
            "(streaming chunks) re-sends the whole prompt logprob lists",
    install=_install_stream_input_logprobs_resent,
    topologies=ALL,
    expected="unknown (written blind): duplicated input_token_logprobs/input_top_logprobs (the prompt's "
             "list repeated per output chunk) for a streamed request with input logprobs",
)


ALL_BLIND4 = (
    "blind4_start_zero_prefix_uncapped",
    "blind4_chunk_edge_target_dropped",
    "blind4_merge_logprob_pad_swapped",
    "blind4_finishing_token_logprob_dropped",
    "blind4_stream_input_logprobs_resent",
)
