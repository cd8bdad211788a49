"""Scenarios of the live SGLang bugs in the known-bug registry
(``scripted_runtime/known_bugs.py``).

Each asserts what SGLang *should* do, so it fails on a build with the bug
and passes on one without it; ``tests/server/test_known_bugs.py`` runs each as a
strict xfail on the topologies its entry names.

    .venv/bin/scripted-runtime run scenarios/known_bugs.py:pp_pause_ignored --pp 4
"""
from scripted_runtime.scheduler_side.explore import program as explore


def pp_pause_ignored(ctx, mode="in_place", paused_steps=12):
    """pause_generation(mode) must stop generation until continue_generation.

    On 0.5.23 the normal and overlap loops skip scheduling while
    ``_engine_paused`` is set; ``event_loop_pp`` never reads it, so at pp>1 the
    request keeps decoding through the pause (docs/upstream/pp-pause-ignored.md).
    The pause contract reports it the iteration a forward is launched while
    paused; the assert below says the same with the contracts switched off.
    """
    r = ctx.start_req(prompt_len=16, max_new_tokens=40, ignore_eos=True, temperature=0.0)
    yield from ctx.wait_until(lambda: len(r.output_ids) >= 2, max_steps=100, what="two output tokens")
    op = ctx.pause_generation(mode)
    yield from op.wait(max_steps=20)
    assert ctx.is_paused, f"pause_generation({mode}) processed but the scheduler is not paused: {op}"
    # A forward launched before the pause may still deliver its token:
    # give every PP slot one round to drain, then nothing may move.
    yield from ctx.steps(max(1, ctx.pp_loop_size))
    frozen = len(r.output_ids)
    yield from ctx.steps(paused_steps)
    advanced = len(r.output_ids) - frozen
    assert advanced == 0, (f"generation went on while paused ({mode}): {advanced} tokens in {paused_steps} "
                           f"iterations after the pause was processed; state: {ctx.describe()}")
    ctx.continue_generation()
    yield from ctx.wait_finished(r, max_steps=600)
    assert len(r.output_ids) == 40, r
    return {"mode": mode, "advanced": advanced}


def pp_release_while_paused_runs_waiting(ctx):
    """Memory released while generation is paused stays unread until it is
    resumed. SGLang's ``release_memory_occupation`` asserts the engine idle
    but lets requests wait in the queue while it is paused
    (``is_fully_idle(ignore_waiting=paused)``), because a paused engine does
    not schedule them; the RL cycle (pause, release, update, resume,
    continue) relies on it.

    On 0.5.23 ``event_loop_pp`` never reads the pause (``pp_pause_ignored``),
    so a request that waited for KV when the memory was released is
    prefilled right after the release gave the KV back, over the released
    KV cache and weights: on a GPU a forward over unmapped memory
    (docs/upstream/pp-pause-ignored.md, "A second consequence"). Found by
    the pp4 dev exploration (grammar 10); this is its shrunk program. The
    ``memory_occupation`` contract reports the forward.
    """
    reqs = [ctx.start_req(input_ids=explore.prompt_ids(0, 8), max_new_tokens=4, ignore_eos=True, temperature=0.0,
                          stream=True),
            ctx.start_req(input_ids=explore.prompt_ids(0, 8), max_new_tokens=1, ignore_eos=True, temperature=0.0)]
    yield from explore.slow_down(ctx, 0.001)
    yield from explore.continue_generation(ctx, reqs)
    yield from explore.exhaust_kv(ctx, 0)  # the requests that have not started wait for KV
    yield from ctx.steps(1)
    yield from explore.rl_cycle(ctx, reqs, pause_mode="retract", tags="all", gap=1)
    return (yield from explore.end_state_checks(ctx, reqs))


def pp_retract_chunk_double_release(ctx):
    """A retract pause while a chunked prompt's last chunk is in flight must
    leave a working scheduler: every request finishes or is aborted, the
    engine goes back to idle with whole pools.

    On 0.5.23 at pp=4 the retract takes the chunked request C from the
    current slot's stale ``last_batch`` although its last chunk is still in
    flight in another slot's ``mbs``; C is recomputed from the waiting queue
    *and* adopted by that slot as a decode, so two results finish it and the
    second ``release_kv_cache`` (``mem_cache/common.py``) asserts "Only a
    mamba-capable tree cache allows freeing before alloc": the scheduler dies
    (docs/upstream/pp-retract-chunk-double-release.md). The program is the one
    ``scripted-runtime explore --pp 4`` found and shrank (dev profile, seed 7),
    kept as it was written (its abort is incidental).
    """
    from scripted_runtime.scheduler_side.explore import program as explore

    reqs = [ctx.start_req(input_ids=[1] * 8, max_new_tokens=2, ignore_eos=True, temperature=0.0)]
    yield from explore.flush_cache(ctx)
    yield from ctx.steps(3)
    reqs.append(ctx.start_req(input_ids=[1] * 8, max_new_tokens=10, ignore_eos=True, temperature=0.0))
    reqs.append(ctx.start_req(input_ids=[3] * 63, max_new_tokens=2, ignore_eos=True, temperature=0.0))
    yield from ctx.steps(6)
    ctx.pause_generation("retract")
    explore.abort_one(ctx, reqs, 0)
    return (yield from explore.end_state_checks(ctx, reqs))


def pp_retract_chunk_duplicate_token(ctx, middle_chunk=False):
    """A retract pause while a prompt is being prefilled in chunks must not
    change what the request outputs: with greedy sampling, exactly the
    tokens of the same prompt run alone.

    On 0.5.23 at pp=4 a chunk result computed before the retract is
    processed after it, as if the retract had not happened
    (``prepare_for_extend`` of the recompute clears ``is_retracted``):

    * ``middle_chunk=False``: its last chunk is in flight. The request (a
      65-token prompt of random tokens, one new token) outputs 365 where the
      prompt alone gives 210, and 365 is what the prompt's first 64 tokens
      predict, the non-final chunk's prediction that SGLang computes and
      normally drops. The program is the one ``scripted-runtime explore --pp
      4`` found and shrank (dev profile, seed 11, program 831). With the
      earlier context-free weights the same bug showed as a duplicated
      token ([8, 8] for [8, 429]): a chunk's prediction then equalled the
      full prompt's.
    * ``middle_chunk=True``: a middle chunk is in flight (a 192-token
      prompt's first 64 tokens; two flushes, refused, let it launch). The
      retract zeroes the request's ``inflight_middle_chunks``; the recompute
      runs chunks ending at 56 (sharing the 64-token budget with an 8-token
      request), 120, 184 and 192, counting each middle one; the stale
      result of the old chunk takes one of those counts, so the chunk
      ending at 184 is committed as if final: the output is [265, 456, 407,
      ...] for [456, 407, ...], 265 being what the prompt's first 184
      tokens predict (the step trace's extends, ``ReqHandle.extend_ends``).
      Found by the pp4 request-fuzzing run (dev profile, seed 11, after 695
      programs) and shrunk; it holds no fuzzed request.

    The output oracle reports both (``OutputMismatch ... a non-final chunk's
    token``); same cause as ``pp_retract_chunk_double_release``
    (docs/upstream/pp-retract-chunk-double-release.md).
    """
    from scripted_runtime.scheduler_side.explore import program as explore

    if middle_chunk:
        reqs = [ctx.start_req(input_ids=explore.prompt_ids(1, 192), max_new_tokens=3, ignore_eos=False,
                              temperature=0.0, stream=True),
                ctx.start_req(input_ids=explore.prompt_ids(0, 8), max_new_tokens=1, ignore_eos=True,
                              temperature=0.0)]
        yield from explore.flush_cache(ctx)
        yield from explore.flush_cache(ctx)
    else:
        reqs = [ctx.start_req(input_ids=explore.prompt_ids(0, 65), max_new_tokens=1, ignore_eos=True,
                              temperature=0.0)]
        yield from ctx.steps(1)
    ctx.pause_generation("retract")
    return (yield from explore.end_state_checks(ctx, reqs))


def pp_retract_chunk_abort_dropped(ctx):
    """An abort of a request SGLang was running must finish it (FINISH_ABORT):
    only a request held by the waiting queue alone may be dropped without a
    finish reason.

    On 0.5.23 at pp=4: a 192-token prompt's first chunk is launched in slot
    0; ``pause_generation(retract)`` takes it (it is ``chunked_req``) while
    that chunk is in flight, and ``abort_all`` in the same ingest finds it in
    the waiting queue and drops it. The stale chunk in ``mbs[0]`` is still
    processed later (and skipped: the request is retracted); the request
    leaves the scheduler with no finish reason while a slot's in-flight batch
    held it when the abort came: the harness's abort contract reports it.
    Same cause as ``pp_retract_chunk_double_release`` (a retract of a request
    whose chunk is in flight in another slot;
    docs/upstream/pp-retract-chunk-double-release.md). Found by the pp4
    request-fuzzing run (dev profile, seed 11, program 701; its fuzzed
    action, an abort of an unknown rid, is incidental and left out here).
    """
    from scripted_runtime.scheduler_side.explore import program as explore

    reqs = [ctx.start_req(input_ids=explore.prompt_ids(1, 192), max_new_tokens=3, ignore_eos=False,
                          temperature=0.0, stream=True)]
    yield from explore.flush_cache(ctx)
    yield from explore.flush_cache(ctx)
    ctx.pause_generation("retract")
    ctx.abort_all()
    return (yield from explore.end_state_checks(ctx, reqs))


def _retract_and_abort_in_one_ingest(ctx, input_ids):
    """One request (8 new tokens, streamed), a flush, six iterations, then
    ``pause_generation(retract)`` and an abort of the request processed in
    one ingest; eight iterations, ``continue_generation``, the end-state
    checks."""
    from scripted_runtime.scheduler_side.explore import program as explore

    reqs = [ctx.start_req(input_ids=input_ids, max_new_tokens=8, ignore_eos=True, temperature=0.0, stream=True)]
    yield from explore.flush_cache(ctx)
    yield from ctx.steps(6)
    ctx.pause_generation("retract")
    explore.abort_one(ctx, reqs, 0)
    yield from ctx.steps(8)
    ctx.continue_generation()
    return (yield from explore.end_state_checks(ctx, reqs))


def pp_retract_abort_stale_last_mbs(ctx):
    """The idle gate must not say idle while a live request is held:
    ``is_fully_idle()`` true means a ``flush_cache`` may reset the pools.

    On 0.5.23 at pp=4: an 8-token request has prefilled in slot 0; a
    ``pause_generation(retract)`` takes it from ``last_batch`` and an abort
    in the same ingest drops it from the waiting queue, unfinished. The pause
    clears ``self.last_batch`` but not ``last_mbs[0]``, which still holds
    the request: ``is_fully_idle()`` says idle while it is held there (the
    harness's ``idle_gate`` invariant), and the next reset, merging the stale
    batch back, dies in ``release_kv_cache``. The "second hazard" of
    docs/upstream/pp-retract-chunk-double-release.md, met by the pp4
    request-fuzzing run (dev profile, seed 11, after 1,024 programs; its
    in-place pause, flush and fuzzed requests are incidental, left out).
    """
    from scripted_runtime.scheduler_side.explore import program as explore

    return (yield from _retract_and_abort_in_one_ingest(ctx, explore.prompt_ids(0, 8)))


def pp_retract_abort_adopted_decode_leak(ctx):
    """Every KV slot is free, cached or held by a live request (the pools
    add up).

    On 0.5.23 at pp=4: a 128-token prompt prefills in two chunks (slots 0
    and 1); while the second is in flight, a ``pause_generation(retract)``
    takes the request and an abort in the same ingest drops it from the
    waiting queue. Slot 1 then processes the stale last chunk and adopts the
    request as a decode (step 4 of the cause in
    docs/upstream/pp-retract-chunk-double-release.md), allocating a KV slot
    for its next token although the request holds no row any more: one
    token is neither free, cached nor held (``pool_accounting``: 8191 of
    8192), and the next reset dies in ``release_kv_cache``. Met by the pp4
    request-fuzzing run (dev profile, seed 11, program 1,024; its in-place
    pause, flush and fuzzed requests are incidental, left out).
    """
    from scripted_runtime.scheduler_side.explore import program as explore

    return (yield from _retract_and_abort_in_one_ingest(ctx, explore.prompt_ids(2, 128)))


def pp_retract_chunk_two_slots(ctx):
    """A retract pause while a chunked prompt's last chunk is in flight must
    leave every request in one place: each finishes once, and no KV it still
    uses is ever on the allocator's free list.

    On 0.5.23 at pp=4: the 64-token prompt of token 3 shares the 64-token
    chunk budget with the 8-token one, so its prefill is split over slots 0
    and 1; the retract (step 6) takes it while its last chunk is in flight in
    slot 1. It is recomputed from the waiting queue in slot 0 *and* adopted
    by slot 1 as a decode (step 8: ``mb0:E[...]`` and ``mb1:D[...]`` hold the
    same request); one of the two frees KV the other still decodes on:
    invariant slot_ownership at step 13 in the explorer's run, before the
    double release of ``pp_retract_chunk_double_release`` kills the scheduler
    (the next reset dies in ``release_kv_cache``). Same cause
    (docs/upstream/pp-retract-chunk-double-release.md, "Third symptom"). The
    program is the one ``scripted-runtime explore --pp 4`` found (dev profile,
    seed 7, program 792 of the run; shrinking met crashes and kept all 11
    actions), kept as it was written, after loading the weights the
    explorer's programs ran with (its output oracle loads them first).
    Run this way on a fresh server, the step trace is the explorer's up to
    its failing step, but the scheduler reaches the double release (the
    crash) before the invariant sees the freed KV; which of the two comes
    first was not pinned down, so the registry entry accepts either.
    """
    from scripted_runtime.scheduler_side import state
    from scripted_runtime.scheduler_side.explore import program as explore

    op = ctx.update_weights_from_disk(flush_cache=True, await_arrival=True)
    yield from op.wait(max_steps=20 * ctx.pp_loop_size)
    assert op.success, op
    # the program started at PP slot 0 (as every script does): come round to it again
    yield from ctx.wait_until(lambda: state.pp_slot(ctx.scheduler) in (None, 0), max_steps=ctx.pp_loop_size,
                              what="PP slot 0")
    reqs = [ctx.start_req(input_ids=[1] * 8, max_new_tokens=3, ignore_eos=True, temperature=0.0)]
    explore.abort_one(ctx, reqs, 0)
    yield from explore.flush_cache(ctx)
    ctx.continue_generation()
    reqs.append(ctx.start_req(input_ids=[1] * 8, max_new_tokens=1, ignore_eos=True, temperature=0.0))
    reqs.append(ctx.start_req(input_ids=[3] * 64, max_new_tokens=10, ignore_eos=True, temperature=0.0))
    ctx.continue_generation()
    reqs.append(ctx.start_req(input_ids=[1] * 63, max_new_tokens=6, ignore_eos=True, temperature=0.0))
    yield from ctx.steps(6)
    ctx.pause_generation("retract")
    return (yield from explore.end_state_checks(ctx, reqs))


def pp_retract_chunk_input_logprobs_crash(ctx):
    """A retract pause (continued at once) while a 3-chunk prompt that asks
    for input logprobs is in its first chunks must leave a working
    scheduler and the request's answer as the same prompt alone gives it.

    On 0.5.23 at pp=4 the retract takes the request while a chunk of it is
    in flight (``pp_retract_chunk_double_release``'s cause); without
    logprobs the same program commits a non-final chunk's token
    (``pp_retract_chunk_duplicate_token``). With input logprobs the result
    processor's ``assert len(req.logprob.input_token_logprobs_val) ==
    relevant_tokens_len`` (``add_input_logprob_return_values``) fails and
    the scheduler dies (docs/upstream/pp-retract-chunk-double-release.md).
    Found by a pp4 dev exploration (2026-11-28, grammar 14, program 288),
    where the registry first took it for ``logprob_start_len_negative`` (the
    same assert, another cause: its start was 32); cut down by hand to this.
    The continue right after the pause keeps the engine from running while
    paused, so ``pp_pause_ignored``'s contract does not fail it first.
    """
    reqs = [ctx.start_req(input_ids=explore.prompt_ids(1, 150), max_new_tokens=11, ignore_eos=True,
                          temperature=0.0, top_logprobs=2, logprob_start_len=32)]
    yield from ctx.steps(1)
    ctx.pause_generation("retract")
    yield from explore.continue_generation(ctx, reqs)
    return (yield from explore.end_state_checks(ctx, reqs))


def prompt_token_out_of_vocab(ctx, past_vocab=88, prompt_len=8):
    """A prompt holding a token id past the model's vocabulary must be refused
    cleanly (an HTTP 4xx answer from the tokenizer manager, or an abort
    answer), and the server must go on serving: the next well-formed request
    finishes.

    On 0.5.23 the tokenizer manager checks a prompt's length against the
    context length (``_validate_one_request``) and the ids of
    ``token_ids_logprob`` against the vocabulary (``_validate_token_ids_logprob``),
    but not the prompt's own ids; the scheduler admits the request and its
    prefill's embedding lookup (``VocabParallelEmbedding``) raises
    ``IndexError: index out of range in self`` on the CPU (a device-side
    assert on a GPU): the scheduler dies, and with it every request of every
    client (docs/upstream/prompt-token-out-of-vocab.md).
    """
    vocab = int(ctx.scheduler.model_config.vocab_size)
    bad_id = vocab + past_vocab
    bad = ctx.start_req(input_ids=[bad_id] * prompt_len, max_new_tokens=4, ignore_eos=True, temperature=0.0)
    yield from ctx.wait_until(lambda: bad.finished or bad.http.done, max_steps=40,
                              what=f"the request with token id {bad_id} (vocabulary {vocab}) to be refused or end")
    refused = bad.http.wait(30.0) and bad.http.status is not None and 400 <= bad.http.status < 500
    assert refused or bad.status == "aborted", (
        f"a prompt of token id {bad_id} (vocabulary {vocab}) was neither refused (HTTP {bad.http.status}) "
        f"nor aborted (status {bad.status})")
    good = ctx.start_req(input_ids=list(range(3, 3 + prompt_len)), max_new_tokens=4, ignore_eos=True,
                         temperature=0.0)
    yield from ctx.wait_finished(good, max_steps=100)
    assert good.status == "finished" and len(good.output_ids) == 4, good
    return {"bad_token": bad_id, "vocab": vocab, "http_status": bad.http.status, "refused": refused}


def top_logprobs_num_past_vocab(ctx, past_vocab=100, prompt_len=8):
    """A request asking for more top logprobs than the vocabulary has must be
    refused cleanly (or served with at most the vocabulary), and the server
    must go on serving: the next well-formed request finishes.

    On 0.5.23 nothing checks ``top_logprobs_num`` (the tokenizer manager
    checks ``token_ids_logprob``'s ids against the vocabulary, not this
    count); the logits processor takes ``max(top_logprobs_nums)`` over the
    batch and calls ``logprobs.topk(max_k)``
    (``layers/logprob_processor.py``, ``get_top_logprobs_raw``), which raises
    ``RuntimeError: selected index k out of range`` for k past the
    vocabulary: the scheduler dies with every request of every client on it
    (docs/upstream/top-logprobs-num-past-vocab.md). Found by the explorer's
    request fuzzing (``explore --fuzz-requests``, case
    ``top_logprobs_past_vocab``).
    """
    vocab = int(ctx.scheduler.model_config.vocab_size)
    k = vocab + past_vocab
    answer = yield from _one_request_then_the_next(
        ctx, {"return_logprob": True, "top_logprobs_num": k}, prompt_len,
        what=f"the request asking for {k} top logprobs (vocabulary {vocab})")
    return {"top_logprobs_num": k, "vocab": vocab, **answer}


def logprob_start_len_negative(ctx, start=-5, prompt_len=8):
    """A ``logprob_start_len`` below -1 (-1 means "the default") must be
    refused cleanly or served, and the server must go on serving: the next
    well-formed request finishes.

    On 0.5.23 nothing refuses it: ``Scheduler.handle_generate_request``
    aborts a ``logprob_start_len`` past the prompt, but keeps a negative
    one; the prefill clamps it to the prefix (``compute_extend_logprob_start_len``:
    ``max(logprob_start_len, prefix_len)``) and computes every prompt
    position's logprob, while the result processor counts the positions it
    expects as ``len(req.origin_input_ids[req.logprob_start_len:])``, a
    Python slice from the end (5 for -5), and asserts the two agree
    (``add_input_logprob_return_values``): the scheduler dies
    (docs/upstream/logprob-start-len-negative.md). Found by the explorer's
    request fuzzing (case ``logprob_start_negative``).
    """
    answer = yield from _one_request_then_the_next(
        ctx, {"return_logprob": True, "logprob_start_len": start}, prompt_len,
        what=f"the request with logprob_start_len={start}")
    return {"logprob_start_len": start, **answer}


def input_logprob_last_vocab_id_zeroed(ctx):
    """A request asking for input logprobs from token 0 on a prompt that
    holds the vocabulary's last id (``vocab_size - 1``, a real token of a
    text model) and the one before it: its ``input_token_logprobs`` must
    name the prompt's tokens (the logprob contract).

    On 0.5.23 the result processor builds the ids as ``origin_input_ids[start:]``
    with ``x if x < vocab_size - 1 else 0``
    (``SchedulerLogprobResultProcessor._process_input_token_logprobs``,
    "clip padded hash values from image tokens"): the last id is rewritten
    as token 0, the one before it kept
    (docs/upstream/input-logprob-last-vocab-id-zeroed.md). Found by the
    logprob contract's review of the explorer's prompts (tokens 3 to 511 of
    a 512-token vocabulary; none of the first 192 of a family is 511, so
    the explorer never met it), confirmed by this scenario.
    """
    vocab = int(ctx.scheduler.model_config.vocab_size)
    prompt = [3, 4, 5, vocab - 1, 6, 7, vocab - 2, 8]
    h = ctx.start_req(input_ids=prompt, max_new_tokens=2, ignore_eos=True, temperature=0.0, top_logprobs=2,
                      logprob_start_len=0)
    end = yield from explore.end_state_checks(ctx, [h])
    assert end["logprobs_checked"] == 1, end
    return {"vocab_size": vocab, **end}


def _one_request_then_the_next(ctx, fields, prompt_len, *, what):
    """Send one request with ``fields`` (as a client would: ``ctx.send_generate``),
    require a clean end (refused, aborted or served, with an answer), then
    require the next well-formed request to be served."""
    bad = ctx.send_generate({"input_ids": list(range(3, 3 + prompt_len)), **fields,
                             "sampling_params": {"max_new_tokens": 4, "ignore_eos": True, "temperature": 0.0}})
    yield from ctx.wait_until(lambda: bad.finished, max_steps=40, what=f"{what} to be refused or end")
    assert bad.http.wait(30.0), f"no answer to {what} (status {bad.status})"
    good = ctx.start_req(input_ids=list(range(3, 3 + prompt_len)), max_new_tokens=4, ignore_eos=True,
                         temperature=0.0)
    yield from ctx.wait_finished(good, max_steps=100)
    assert good.status == "finished" and len(good.output_ids) == 4, good
    return {"http_status": bad.http.status, "status": bad.status}


def expert_distribution_route_without_recorder(ctx):
    """An HTTP route a server serves must not kill it: one
    ``/start_expert_distribution_record`` on a server started without
    ``--expert-distribution-recorder-mode`` (the default) is answered, and
    the next request is served.

    On 0.5.23 the scheduler's handler calls the placeholder recorder, whose
    ``start_record`` raises ``Exception("Please set
    ServerArgs.expert_distribution_recorder_mode ...")``; nothing catches it
    between the dispatcher and ``run_scheduler_process``, which signals the
    parent to quit: one GET takes the server down
    (docs/upstream/expert-distribution-route-without-recorder.md).
    """
    yield from _post_then_serve(ctx, "/start_expert_distribution_record")



def _post_then_serve(ctx, route, body=None):
    """Post ``route`` as a client would (``unchecked``: ``ctx.post_http``
    refuses the routes that kill the scheduler), let it be processed, then
    serve one request: the server must still answer."""
    answer = ctx.post_http(route, body, unchecked=True)
    answer.wait(1.0)  # the scheduler is frozen: this only lets the request reach its socket
    yield from ctx.steps(10)
    answer.wait(10)
    req = ctx.start_req(prompt_len=8, max_new_tokens=2, ignore_eos=True)
    yield from ctx.wait_finished(req, max_steps=50)


def release_memory_syncs_build_device(ctx):
    """``release_memory_occupation`` at idle must work on the server's
    device: on a CPU server it is answered and the next request is served.

    On 0.5.23 the handler ends with ``torch.get_device_module().synchronize()``
    (``managers/scheduler_components/weight_updater.py``); without an
    argument torch names the accelerator it was *built* for, so on a CPU
    server with a CUDA build of torch it calls ``torch.cuda.synchronize()``
    and the scheduler dies ("Found no NVIDIA driver", or "Cannot
    re-initialize CUDA in forked subprocess" in a forked rank); the rest of
    the scheduler asks for ``torch.get_device_module(self.device)``
    (docs/upstream/release-memory-syncs-build-device.md). The harness works
    around it on CPU (``hooks/cpu_enablement.py``, item 5); this scenario
    turns that off for its release.
    """
    import torch

    from scripted_runtime.hooks import cpu_enablement

    if not torch.backends.cuda.is_built():
        raise AssertionError("torch has no CUDA build here: the bug cannot show (its XPASS would mislead)")
    with cpu_enablement.without_release_sync_workaround():
        release = ctx.release_memory_occupation(["kv_cache"])
        yield from release.wait(max_steps=10)
    resume = ctx.resume_memory_occupation()
    yield from resume.wait(max_steps=10)
    req = ctx.start_req(prompt_len=8, max_new_tokens=2, ignore_eos=True)
    yield from ctx.wait_finished(req, max_steps=50)


def resume_memory_not_released(ctx):
    """A ``resume_memory_occupation`` of a tag that is not released (a
    retried or repeated resume: RL frameworks resume weights and the KV
    cache in separate calls) is answered and the server keeps serving.

    On 0.5.23 the handler removes each tag from ``offload_tags`` with
    ``set.remove`` (``managers/scheduler_components/weight_updater.py``):
    a tag not released raises ``KeyError`` in the scheduler, nothing catches
    it, and the server goes down (docs/upstream/resume-memory-not-released.md).
    ``ctx.resume_memory_occupation`` refuses such a call, so this posts it
    with ``ctx.post_http``.
    """
    yield from _post_then_serve(ctx, "/resume_memory_occupation", {"tags": ["kv_cache"]})


def send_weights_without_send_group(ctx):
    """``/send_weights_to_remote_instance`` for a group that was never
    initialized is refused (the handler's own message: "Please call
    `init_weights_send_group_for_remote_instance` first") and the server
    keeps serving.

    On 0.5.23 the handler looks the group up with
    ``self._weights_send_group[group_name]``
    (``model_executor/model_runner_components/weight_exporter.py``), a
    plain dict: the lookup raises ``KeyError`` before the refusal below it
    can run, nothing catches it, and the server goes down
    (docs/upstream/send-weights-without-send-group.md). No ``ctx`` method
    sends this route (docs/control-requests.md, row 16), so this posts it
    with ``ctx.post_http``.
    """
    yield from _post_then_serve(ctx, "/send_weights_to_remote_instance",
                                {"master_address": "127.0.0.1", "ports": "29999", "group_name": "never_initialized"})


def profile_start_while_running_accepted(ctx):
    """A ``/start_profile`` while a profile runs is refused ("Profiling is
    already in progress. Call /stop_profile first.", the handler's own
    message) and the running profile goes on to its stop.

    On 0.5.23 ``SchedulerProfilerManager._profile`` calls ``_init_profile``
    (which returns that refusal) and discards its answer, then calls
    ``_start_profile`` again: a second torch profiler replaces the first,
    which is never stopped, its trace lost, and the call answers success
    (docs/upstream/profile-start-while-running-accepted.md). The
    ``diagnostics`` contract sees the success.
    """
    first = ctx.start_profile()
    yield from first.wait()
    second = ctx.start_profile()
    yield from second.wait()
    stop = ctx.stop_profile()
    yield from stop.wait()
    req = ctx.start_req(prompt_len=8, max_new_tokens=2, ignore_eos=True)
    yield from ctx.wait_finished(req, max_steps=50)


def pp_profiler_stop_with_sends_in_flight(ctx, rounds=100, profile=True):
    """Profiles that start and stop while requests run under PP must leave
    the scheduler intact: every round's two streamed requests finish with
    the outputs a fresh server gives, and the end state is clean.

    On 0.5.23 the PP loop keeps its asynchronous point-to-point sends
    (``send_req_work``, ``send_proxy_work``, ``send_output_work``: gloo
    ``isend``) in flight from one iteration into the next, and the profiler
    stops at a forward (``num_steps``) or at ``/stop_profile`` without
    waiting for them. torch's gloo ``AsyncWork`` finishes a send's profiling
    record on gloo's worker thread; a profiler torn down under it corrupts
    memory: a rank dies of a segmentation fault (its peers see gloo's
    "Connection closed by peer"), a forward's KV store gets an index like
    62997886067213, or the harness's scan reads a length of hundreds of
    TiB. Tens to a few thousand iterations (74 to 2,085 so far; a round is
    about 38) are enough on the 2-core CPU box (torch 2.14.1), and the 100
    rounds stay inside a run's default timeout; the same rounds without the profile pass
    (``scenarios/profiler_stress.py``). With the in-flight sends waited
    before the stop (the built-in workaround ``fence_pp_profiler_stop``, hooks/workarounds.py) it passes
    (docs/upstream/pp-profiler-stop-with-sends-in-flight.md). ``profile=False``:
    the same rounds without the profile, the control.
    """
    reqs = []
    for i in range(rounds):
        batch = [ctx.start_req(input_ids=explore.prompt_ids(i % 3, 8 + 40 * (i % 2)), max_new_tokens=6,
                               ignore_eos=True, temperature=0.0, stream=True, logprob_start_len=0)
                 for _ in range(2)]
        reqs += batch
        if profile:
            op = ctx.start_profile(num_steps=2)
            yield from op.wait(max_steps=100)
        yield from ctx.wait_until(lambda: all(h.finished for h in batch) and not ctx.profiling,
                                  max_steps=400, what="the round's requests and profile to finish")
    return (yield from explore.end_state_checks(ctx, reqs))


def abort_pause_during_in_place_pause(ctx):
    """``pause_generation(abort)`` while an ``in_place`` pause holds a
    running request must end: the request is aborted, the call answers, and
    a ``continue_generation`` afterwards reaches the scheduler.

    On 0.5.23 the tokenizer's abort pause loops, holding ``is_pause_cond``,
    sending ``abort_all`` every second until no request holds its
    ``model_update_lock``; the in-place pause keeps the scheduler from
    finishing the running request (its abort waits for the next decode), so
    the loop never ends, and ``continue_generation``, which needs the same
    condition lock, can never be sent: generation stays paused for good
    (docs/upstream/abort-pause-during-in-place-pause.md).
    """
    from scripted_runtime.scheduler_side.explore import program as explore

    r = ctx.start_req(prompt_len=8, max_new_tokens=40, ignore_eos=True, temperature=0.0)
    yield from ctx.wait_until(lambda: len(r.output_ids) >= 2, max_steps=100, what="two output tokens")
    pause = ctx.pause_generation("in_place")
    yield from pause.wait()
    # steps until the request ended, then waits for the answer: PauseAnswerTimeout when none comes,
    # as in an explored program
    yield from explore.pause(ctx, [r], "abort")
    ctx.continue_generation()
    yield from ctx.wait_finished(r, max_steps=100)
    assert r.status == "aborted", r


def prefill_only_abort_reports_dummy_token(ctx):
    """A prefill-only request (``max_new_tokens=0``) aborted while its
    prefill is in flight must answer with no output token: none was asked
    for, and the model generated none (the output oracle, run by the
    end-state checks).

    On 0.5.23 a prefill-only batch is not sampled: ``TpModelWorker`` fills
    ``next_token_ids`` with zeros. The result processor
    (``process_batch_result_prefill``) appends that dummy 0 to
    ``output_ids`` like a sampled token and relies on
    ``Req.update_finish_state`` to cut the output at ``finished_len =
    max_new_tokens`` (0). When an abort was processed between the prefill's
    launch and its result (the overlap loop processes a batch's result one
    iteration after launching it), ``to_finish`` is set, so
    ``update_finish_state`` takes the abort and returns before the length
    rule: ``finished_len`` stays None and the answer reports the dummy
    token as output (docs/upstream/prefill-only-abort-reports-dummy-token.md).
    Found by a ci exploration of the unmutated build on pp1-overlap
    without the seed corpus (2026-11-28), shrunk to a resend of a cached
    prompt; the cache hit is not needed.
    """
    h = ctx.start_req(input_ids=explore.prompt_ids(0, 8), max_new_tokens=0, ignore_eos=True, temperature=0.0)
    # the prefill launched; under overlap its result is processed next iteration, after the abort
    yield from ctx.wait_until(lambda: h.status not in ("posted", "waiting"), max_steps=8,
                              what="the prefill-only request admitted")
    ctx.abort(h)
    yield from ctx.wait_finished(h, max_steps=20)
    # the oracle judges the request's output as SGLang answers it (``Req.output_ids`` holds the dummy
    # token on every loop: the answer is cut at finished_len)
    return (yield from explore.end_state_checks(ctx, [h]))


def _misfit_checkpoint(checkpoint: str) -> str:
    """A copy of the harness's update checkpoint (a folder) with its token
    embedding cut to half its elements, so SGLang's loader refuses it (the
    embedding is the first pipeline stage's: under PP the driver rank, whose
    answer the client gets, is the one that fails): written once,
    atomically, in a folder beside that checkpoint in the harness's own
    model cache (a crash of the scheduler cannot leave a temporary folder
    behind)."""
    import os
    import shutil
    import tempfile

    from safetensors.torch import load_file, save_file

    target = os.path.join(os.path.dirname(checkpoint.rstrip("/")),
                          os.path.basename(checkpoint.rstrip("/")) + "-misfit-embedding")
    if os.path.isdir(target):
        return target
    staging = tempfile.mkdtemp(prefix=".misfit-", dir=os.path.dirname(target))
    try:
        for name in os.listdir(checkpoint):
            src = os.path.join(checkpoint, name)
            if name.endswith(".safetensors"):
                tensors = load_file(src)
                cut = next((n for n in sorted(tensors) if n.endswith("embed_tokens.weight")), sorted(tensors)[0])
                tensors[cut] = tensors[cut].reshape(-1)[: tensors[cut].numel() // 2].clone()
                save_file(tensors, os.path.join(staging, name))
            elif os.path.isfile(src):
                shutil.copy(src, staging)
        os.rename(staging, target)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
        if not os.path.isdir(target):
            raise
        # another process wrote it first (renaming onto its folder: EEXIST or ENOTEMPTY)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


def disk_update_rollback_reloads_the_failed_checkpoint(ctx):
    """``update_weights_from_disk`` of a checkpoint whose tensors do not fit
    the model must answer failure and leave the served weights as they were
    ("Rolling back to original weights"), and the server must serve the next
    request.

    On 0.5.23 ``ModelRunner``'s weight updater
    (``model_runner_components/weight_updater.py``) sets
    ``model_config.model_path`` to the new path before it loads, and its
    rollback builds the weights iterator from that ``model_config``: it
    loads the checkpoint that just failed again, fails the same way inside
    the ``except``, and the exception kills the scheduler
    (docs/upstream/disk-update-rollback-reloads-failed-checkpoint.md).
    An RL trainer that publishes one bad checkpoint takes the server down.
    """
    import os

    from scripted_runtime.protocol import ENV_CHECKPOINT
    from scripted_runtime.scheduler_side.update_sources import weights_fingerprint

    checkpoint = os.environ.get(ENV_CHECKPOINT)
    if not checkpoint or not os.path.isdir(checkpoint):
        raise AssertionError(f"the harness's update checkpoint is not a folder here ({checkpoint!r}): the scenario "
                             "needs the CPU default's checkpoint")
    misfit = _misfit_checkpoint(checkpoint)
    before = weights_fingerprint(ctx.scheduler)
    op = ctx.update_weights_from_disk(misfit, flush_cache=True, await_arrival=True)
    yield from op.wait(max_steps=8 * max(1, ctx.pp_loop_size))
    if op.success:
        raise AssertionError(f"update_weights_from_disk of a checkpoint that does not fit the model answered "
                             f"success: {op.message}")
    after = weights_fingerprint(ctx.scheduler)
    if after != before:
        raise AssertionError(f"the failed update left other weights served (fingerprint {before} before, {after} "
                             "after): no rollback")
    h = ctx.start_req(input_ids=explore.prompt_ids(0, 8), max_new_tokens=4, ignore_eos=True, temperature=0.0)
    yield from ctx.wait_finished(h, max_steps=40 * max(1, ctx.pp_loop_size))
    return (yield from explore.end_state_checks(ctx, [h]))
