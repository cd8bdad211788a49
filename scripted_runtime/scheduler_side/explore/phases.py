"""Which scheduler phase a control operation lands in (scheduler process).

Read from the state the next iteration starts from, i.e. the state the
operation is processed against. ``finished_unpruned``: a finished request is
still held by a batch (issue 14062's window); ``idle``: nothing is held. Several phases can hold at once (a decode
batch in flight at pp=4 is both ``decode`` and ``pp_in_flight``); every one
that holds is counted.
"""
from __future__ import annotations

from typing import Any, List

from scripted_runtime.hooks import sglang_compat
from scripted_runtime.scheduler_side import hicache_state, state, update_sources

PHASES = ("prefill_chunk", "decode", "pp_in_flight", "queued", "paused", "finished_unpruned", "idle")
# Phases of an engine feature, shown as coverage columns only where they were seen:
# ``hicache_transfer``: a HiCache load or backup is issued and not reaped yet.
FEATURE_PHASES = ("hicache_transfer",)


def _live(reqs) -> bool:
    return any(not r.finished() for r in reqs)


def phases_of(s: Any, *, tokenizer_paused: bool = False) -> List[str]:
    out = []
    holders = state.holders(s)
    extend = decode = in_flight = queued = unpruned = False
    for h in holders:
        if h.label == "waiting_queue":
            queued = queued or bool(h.reqs)
            continue
        if h.label == "chunked_req":
            extend = extend or _live(h.reqs)
            continue
        unpruned = unpruned or any(r.finished() for r in h.reqs)
        if not _live(h.reqs):
            continue
        mode = getattr(h.batch, "forward_mode", None)
        if mode is not None and mode.is_extend():
            extend = True
        elif (mode is not None and mode.is_decode()) or h.label.startswith("running"):
            decode = True
        if h.label.startswith(("mbs", "running_mbs")):
            in_flight = True
    if extend:
        out.append("prefill_chunk")
    if decode:
        out.append("decode")
    if in_flight:
        out.append("pp_in_flight")
    if queued:
        out.append("queued")
    if tokenizer_paused or sglang_compat.is_paused(s):
        out.append("paused")
    if unpruned:
        out.append("finished_unpruned")
    if not any(h.reqs for h in holders):  # SGLang always keeps a running_batch, empty when idle
        out.append("idle")
    if hicache_state.load_back_pending(s) or hicache_state.write_through_pending(s):
        out.append("hicache_transfer")
    return out


def op_kind(name: str, payload: Any) -> str:
    """The coverage-table row of a control operation."""
    if name.startswith("abort("):
        return "abort"
    if name.startswith("pause_generation"):
        return name.replace("pause_generation", "pause")
    if name == "continue_generation":
        return "continue"
    if name == "update_weights_from_disk":
        if update_sources.checkpoint_missing((payload or {}).get("model_path")):
            return "update_weights(missing)"
        flush = bool((payload or {}).get("flush_cache", True))
        return f"update_weights({'flush' if flush else 'no_flush'})"
    if name == "update_weights_from_tensor":
        return "update_weights(tensor)"
    if name == "update_weights_from_distributed":
        return "update_weights(distributed)"
    if name.startswith(("release_memory_occupation", "resume_memory_occupation")):
        # release(all) / release(kv_cache) / resume(weights): KV and weights together are "all";
        # cuda_graph (nothing on CPU) is named only alone
        verb, _, tags = name.partition("(")
        named = set(tags.rstrip(")").split(","))
        if {"kv_cache", "weights"} <= named:
            short = "all"
        else:
            short = ",".join(sorted(named - {"cuda_graph"})) or "cuda_graph"
        return f"{verb.partition('_')[0]}({short})"
    if name.startswith("load_lora_adapter("):
        return "lora:load"
    if name.startswith("load_lora_adapter_from_tensors("):
        return "lora:load_tensors"
    if name.startswith("unload_lora_adapter("):
        return "lora:unload"
    if name.startswith(("set_internal_state(", "slow_down(", "get_weights_by_name(", "update_weight_version(",
                        "open_session(", "close_session(", "configure_logging(", "start_profile(")):
        return name.partition("(")[0]
    return name
