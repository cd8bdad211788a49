"""LoRA adapters loaded and unloaded at run time (the ``pp1-lora`` topology).

    scripted-runtime run --topology pp1-lora scenarios/lora.py:load_serve_unload
    scripted-runtime run --topology pp1-lora scenarios/lora.py:load_from_tensors
"""
from scripted_runtime.scheduler_side.explore.prompts import prompt_ids

PROMPT = prompt_ids(0, 24)
# SGLang's tokenizer sends an unload once no request uses the adapter, on its own clock: wait for
# its arrival by time (idle steps take ~0.4 ms each, so 200 of them missed it once), then step.
UNLOAD_ARRIVAL_S = 10.0


def load_serve_unload(ctx):
    """Load an adapter; a request with it and the same prompt without it run
    side by side in one batch and answer different tokens (the adapter
    changes the output; the base request is the base model's); an unload
    posted while the adapter's request runs reaches the scheduler only after
    that request finished, and then the adapter is gone."""
    load = ctx.load_lora_adapter("lora0")
    yield from load.wait()
    assert load.success, f"load_lora_adapter('lora0') refused: {load.answer!r}"
    assert ctx.loaded_lora_adapters == ("lora0",), ctx.loaded_lora_adapters
    with_adapter = ctx.start_req(input_ids=PROMPT, max_new_tokens=6, ignore_eos=True, temperature=0.0, lora="lora0")
    base = ctx.start_req(input_ids=PROMPT, max_new_tokens=6, ignore_eos=True, temperature=0.0)
    yield from ctx.steps(2)
    unload = ctx.unload_lora_adapter("lora0")
    for _ in range(60):
        if with_adapter.status in ("finished", "aborted"):
            break
        assert not unload.processed, "the unload reached the scheduler while a request using the adapter ran"
        yield
    yield from ctx.wait_finished(with_adapter, base, max_steps=60)
    assert with_adapter.output_ids != base.output_ids, "the adapter changed nothing"
    ctx.await_arrival(unload, UNLOAD_ARRIVAL_S)
    yield from unload.wait(max_steps=200)
    assert unload.success, f"unload_lora_adapter('lora0') refused: {unload.answer!r}"
    assert ctx.loaded_lora_adapters == (), ctx.loaded_lora_adapters
    return {"with_adapter": with_adapter.output_ids, "base": base.output_ids}


def load_from_tensors(ctx):
    """The same adapter loaded from its files and, after an unload, from its
    tensors (``load_lora_adapter_from_tensors``, the RL trainer's path):
    a request with it answers the same tokens both times, and other tokens
    than the base model beside it."""
    files = ctx.load_lora_adapter("lora1")
    yield from files.wait()
    assert files.success, f"load_lora_adapter('lora1') refused: {files.answer!r}"
    from_files = ctx.start_req(input_ids=PROMPT, max_new_tokens=6, ignore_eos=True, temperature=0.0, lora="lora1")
    yield from ctx.wait_finished(from_files, max_steps=60)
    unload = ctx.unload_lora_adapter("lora1")
    ctx.await_arrival(unload, UNLOAD_ARRIVAL_S)
    yield from unload.wait(max_steps=200)
    assert unload.success and ctx.loaded_lora_adapters == (), (unload.answer, ctx.loaded_lora_adapters)
    tensors = ctx.load_lora_adapter_from_tensors("lora1")
    yield from tensors.wait()
    assert tensors.success, f"load_lora_adapter_from_tensors('lora1') refused: {tensors.answer!r}"
    assert ctx.loaded_lora_adapters == ("lora1",), ctx.loaded_lora_adapters
    from_tensors = ctx.start_req(input_ids=PROMPT, max_new_tokens=6, ignore_eos=True, temperature=0.0, lora="lora1")
    base = ctx.start_req(input_ids=PROMPT, max_new_tokens=6, ignore_eos=True, temperature=0.0)
    yield from ctx.wait_finished(from_tensors, base, max_steps=60)
    assert from_tensors.output_ids == from_files.output_ids, (from_tensors.output_ids, from_files.output_ids)
    assert from_tensors.output_ids != base.output_ids, "the adapter changed nothing"
    return {"from_files": from_files.output_ids, "from_tensors": from_tensors.output_ids, "base": base.output_ids,
            "tensors": tensors.payload["tensors"]}


def three_adapters_two_slots(ctx):
    """Three adapters, two slots a batch (``max_loras_per_batch=2``): three
    requests, one per adapter, all finish; a forward never holds more
    adapters than the slots (the ``lora`` contract checks every forward)."""
    for name in ("lora0", "lora1", "lora2"):
        op = ctx.load_lora_adapter(name)
        yield from op.wait()
        assert op.success, f"load_lora_adapter({name!r}) refused: {op.answer!r}"
    reqs = [ctx.start_req(input_ids=prompt_ids(i, 16), max_new_tokens=4, ignore_eos=True,
                          temperature=0.0, lora=name) for i, name in enumerate(("lora0", "lora1", "lora2"))]
    yield from ctx.wait_finished(*reqs, max_steps=120)
    return [r.output_ids for r in reqs]


def nothing_loaded(ctx):
    """After the engine reset nothing a script loaded is left: the reset
    unloads every adapter (a name still loaded would be refused by the next
    script's load)."""
    assert ctx.loaded_lora_adapters == (), f"left loaded after the reset: {ctx.loaded_lora_adapters}"
    return sorted(ctx.lora_adapters)
    yield


def refusals(ctx):
    """What ``ctx`` refuses, each with its reason in one line: a request
    naming an adapter the scheduler does not hold (SGLang's tokenizer would
    load it itself, which the frozen scheduler cannot answer), a second LoRA
    update before the first was processed, an adapter the harness does not
    offer, and a raw post of the scripted route."""
    out = {}
    for key, call in (("unloaded", lambda: ctx.start_req(prompt_len=8, max_new_tokens=2, lora="lora1")),
                      ("unknown", lambda: ctx.load_lora_adapter("no-such-adapter")),
                      ("raw", lambda: ctx.post_http("/load_lora_adapter", {"lora_name": "lora1"}))):
        try:
            call()
            out[key] = None
        except (RuntimeError, ValueError) as exc:
            out[key] = str(exc)
    first = ctx.load_lora_adapter("lora1")
    try:
        ctx.unload_lora_adapter("lora1")
        out["second"] = None
    except RuntimeError as exc:
        out["second"] = str(exc)
    yield from first.wait()
    return out
