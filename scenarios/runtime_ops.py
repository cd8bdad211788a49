"""Runtime knobs and weight queries against the real scheduler
(docs/control-requests.md rows 22, 23, 26, 27, 30, 32, 33; contracts
``runtime_limits`` and ``weight_queries`` in docs/checks.md).

    .venv/bin/scripted-runtime run scenarios/runtime_ops.py:micro_batch_limit_serialises_admission
    .venv/bin/scripted-runtime run scenarios/runtime_ops.py:weight_queries_follow_the_weights
    .venv/bin/scripted-runtime run scenarios/runtime_ops.py:weight_versions_across_a_pause
"""
from scripted_runtime.scheduler_side.explore import program as explore


def micro_batch_limit_serialises_admission(ctx, limit=1):
    """``set_internal_state(pp_max_micro_batch_size=limit)`` with requests
    queued: from the next prefill on, a (micro)batch admits no more than
    ``limit`` requests (checked every iteration by ``runtime_limits``);
    values outside SGLang's range are refused and change nothing. Every
    request still finishes with its reference output."""
    lo, hi = ctx.micro_batch_limit_range
    default = ctx.micro_batch_limit
    refused = []
    for bad in (lo - 1, hi + 1):
        op = ctx.set_internal_state(pp_max_micro_batch_size=bad)
        yield from op.wait()
        refused.append(op.answer.updated)
    assert refused == [False, False], refused
    assert ctx.micro_batch_limit == default, (ctx.micro_batch_limit, default)
    op = ctx.set_internal_state(pp_max_micro_batch_size=limit)
    yield from op.wait()
    assert op.answer.updated is True and ctx.micro_batch_limit == limit, (op.answer, ctx.micro_batch_limit)
    reqs = [ctx.start_req(input_ids=explore.prompt_ids(i % 3, 8 + 20 * i), max_new_tokens=6, ignore_eos=True,
                          temperature=0.0) for i in range(4)]
    most = 0
    for _ in range(400):
        if all(r.finished for r in reqs):
            break
        yield
        most = max(most, max((len(getattr(b, "reqs", ()) or ()) for b in _running_batches(ctx)), default=0))
    end = yield from explore.end_state_checks(ctx, reqs)
    assert most <= limit, f"a running batch held {most} requests under the limit {limit}"
    return {"default": default, "range": [lo, hi], "most_running": most, "finished": end["finished"],
            "outputs_compared": end["outputs_compared"]}


def _processed(op):
    """``op = yield from _processed(ctx.some_op(...))``: step until it was processed."""
    yield from op.wait()
    return op


def _running_batches(ctx):
    s = ctx.scheduler
    batches = [getattr(s, "running_batch", None)]
    batches += list(getattr(s, "running_mbs", None) or ())
    return [b for b in batches if b is not None]


def weight_queries_follow_the_weights(ctx):
    """``check_weights``: two checksums of unchanged weights agree; after an
    update to another checkpoint the checksum changes; on a CUDA device a
    snapshot compares equal, and a compare against it after the update fails
    (on CPU ``compare`` is refused: SGLang's comparator is CUDA-only).
    ``get_weights_by_name`` answers the checkpoint's values before and after
    (judged by ``weight_queries``) on a model that has it (0.5.23's Qwen2,
    the tiny CPU model, has none: SGLang answers None).
    ``update_weight_version`` labels them."""
    # start from the weights the server was started with (an earlier script on it may have updated them)
    yield from _processed(ctx.update_weights_from_disk(ctx.scheduler.server_args.model_path, await_arrival=True))
    first = yield from _processed(ctx.check_weights("checksum"))
    again = yield from _processed(ctx.check_weights("checksum"))
    cuda = ctx.scheduler.server_args.device == "cuda"
    yield from _processed(ctx.check_weights("snapshot"))
    same = differs = None
    if cuda:
        same = yield from _processed(ctx.check_weights("compare"))
        yield from _processed(ctx.check_weights("snapshot"))
    else:
        try:
            ctx.check_weights("compare")
        except RuntimeError as exc:
            assert "runs only on a CUDA device" in str(exc), exc
        else:
            raise AssertionError("check_weights(compare) was posted on a CPU server")
    before = yield from _processed(ctx.get_weights_by_name("model.layers.0.mlp.down_proj.weight", 2))
    # the harness's checkpoint: other weights
    update = yield from _processed(ctx.update_weights_from_disk(await_arrival=True))
    after = yield from _processed(ctx.get_weights_by_name("model.layers.0.mlp.down_proj.weight", 2))
    changed = yield from _processed(ctx.check_weights("checksum"))
    if cuda:
        differs = yield from _processed(ctx.check_weights("compare"))
    yield from _processed(ctx.update_weight_version("after-update"))
    yield from _processed(ctx.server_info())
    checksum = [op.answer.payload[0].per_gpu_checksum for op in (first, again, changed)]
    result = {
        "checksums_equal_unchanged": checksum[0] == checksum[1],
        "checksum_changed_after_update": checksum[2] != checksum[0],
        "compare_unchanged": same.success if same else None,
        "compare_after_update": differs.success if differs else None,
        "update": update.success,
        "get_weights_answered": before.answer.parameter is not None,
        "rows_changed": before.answer.parameter != after.answer.parameter,
        "version": ctx.weight_version,
        "snapshot_held": ctx.weight_snapshot_held(),
    }
    assert result["checksums_equal_unchanged"] and result["compare_unchanged"] in (True, None), result
    assert result["checksum_changed_after_update"], result
    assert result["rows_changed"] or not result["get_weights_answered"], result
    assert result["compare_after_update"] in (False, None) and result["version"] == "after-update", result
    return result


def slow_down_then_serve(ctx, seconds=0.01):
    """``slow_down``: forwards sleep, iterations stay the unit; a request
    decodes to its reference output; ``slow_down(0)`` clears it."""
    op = ctx.slow_down(seconds)
    yield from op.wait()
    assert ctx.scheduler.forward_sleep_time == seconds, ctx.scheduler.forward_sleep_time
    gc = ctx.freeze_gc()
    r = ctx.start_req(input_ids=explore.prompt_ids(0, 65), max_new_tokens=5, ignore_eos=True, temperature=0.0)
    yield from gc.wait()
    yield from ctx.wait_finished(r, max_steps=100)
    clear = ctx.slow_down(0)
    yield from clear.wait()
    end = yield from explore.end_state_checks(ctx, [r])
    return {"cleared": ctx.scheduler.forward_sleep_time is None, "outputs_compared": end["outputs_compared"]}


def diagnostics_while_serving(ctx):
    """The diagnostics routes while a request decodes (contract
    ``diagnostics`` on every one): ``configure_logging`` sets the
    scheduler's log level; a profile of two forwards stops by itself and
    writes its trace; another, started without a step count, is stopped by
    hand and writes its own; the request's output is untouched (the output
    oracle, at the end). A second start while a profile runs is the known
    bug ``profile_start_while_running_accepted`` (scenarios/known_bugs.py)."""
    return (yield from _diagnostics(ctx))


def _diagnostics(ctx):
    import os

    level = ctx.configure_logging("INFO" if ctx.log_level != "INFO" else "WARNING")
    yield from level.wait()
    set_to = ctx.log_level
    req = ctx.start_req(input_ids=explore.prompt_ids(0, 65), max_new_tokens=10, ignore_eos=True, temperature=0.0)
    yield from ctx.steps(2)
    auto = ctx.start_profile(num_steps=2)
    yield from auto.wait()
    assert auto.success and ctx.profiling, auto.message
    for _ in range(10):
        if not ctx.profiling:
            break
        yield
    assert not ctx.profiling, "a profile of 2 forwards still runs after 10 iterations"
    manual = ctx.start_profile()
    yield from manual.wait()
    yield from ctx.steps(2)
    stop = ctx.stop_profile()
    yield from stop.wait()
    out = {"level": set_to, "auto": auto.success, "manual": manual.success,
           "stopped": stop.success, "profiling": ctx.profiling,
           "traces": len([f for f in os.listdir(auto.payload["output_dir"]) if ".trace" in f])}
    end = yield from explore.end_state_checks(ctx, [req])
    out["outputs_compared"] = end["outputs_compared"]
    return out


def weight_versions_across_a_pause(ctx, mode="retract"):
    """Three requests decode; a pause (``mode``: retract parks them in the
    waiting queue with their output, in_place keeps them running) and a
    labelled weight update (the RL order: pause, update, continue), then a
    label change while they decode again. Each answer's
    ``meta_info.weight_versions`` must label the tokens made before each
    change with the version before it (the weight-version contract, end
    check ``weight_versions``, judged by ``end_state_checks``)."""
    reqs = [ctx.start_req(input_ids=explore.prompt_ids(i, 8 + 30 * i), max_new_tokens=12, ignore_eos=True,
                          temperature=0.0) for i in range(3)]
    yield from ctx.wait_until(lambda: all(len(r.output_ids) >= 3 for r in reqs), max_steps=60,
                              what="every request decoding with 3 tokens")
    pause = ctx.pause_generation(mode)
    yield from pause.wait()
    update = yield from _processed(ctx.update_weights_from_disk(flush_cache=False, await_arrival=True,
                                                                weight_version="rollout-2"))
    assert update.success and ctx.weight_version == "rollout-2", (update.answer, ctx.weight_version)
    yield from explore.continue_generation(ctx, reqs)
    yield from ctx.wait_until(lambda: all(len(r.output_ids) >= 8 or r.finished for r in reqs), max_steps=60,
                              what="every request at 8 tokens after the continue")
    yield from _processed(ctx.update_weight_version("rollout-3"))
    result = yield from explore.end_state_checks(ctx, reqs)
    records = [r.weight_version_record for r in reqs]
    result["boundaries"] = [[had for _, had in events] for events, _ in records]
    assert result["weight_versions_checked"] == len(reqs), result
    return result
