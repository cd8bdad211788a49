"""Every control request SGLang 0.5.23's scheduler dispatches, and what the
harness does with each: the machine-readable form of
docs/control-requests.md's table (its row numbers).

Per request type (the io_struct class the dispatcher keys on): its HTTP
routes, and one of

* ``scripted``: a ``ctx`` method sends it, waits for its answer and a
  contract judges it; ``ctx.post_http`` refuses the route and names the
  method (a raw post would bypass the op ledger the contracts read);
* ``kills``: posting it kills the scheduler on 0.5.23 (a registered bug,
  ``known_bug``); ``ctx.post_http`` refuses it;
* ``blocks``: the scheduler would block waiting for another process that
  the harness does not run (a trainer joining a torch process group);
  ``ctx.post_http`` refuses it;
* ``sglang_refuses``: on the CPU default SGLang answers it with a refusal
  and goes on (the measured answer is ``reason``); ``ctx.post_http`` sends it;
* ``open``: runs on the CPU default (measured) but is not scripted yet;
  ``ctx.post_http`` sends it (none on 0.5.23 now);
* ``internal``: no HTTP route reaches it (sent by SGLang's own processes).

``reason`` is one line, measured on 0.5.23 (2026-11-27, CPU default,
pp1-overlap, each posted on a live server) unless it says "read off the
code". ``scripted-runtime controls`` prints the catalog; a test checks it
against the dispatcher of the installed SGLang
(``sglang_compat.dispatched_request_types``) and against the docs table.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Sequence, Tuple

STATUSES = ("scripted", "kills", "blocks", "sglang_refuses", "open", "internal")
# the statuses ctx.post_http refuses (unless unchecked=True)
REFUSED_BY_POST_HTTP = ("scripted", "kills", "blocks")


@dataclass(frozen=True)
class ControlRequest:
    type_name: str
    row: int  # docs/control-requests.md
    routes: Tuple[str, ...]
    status: str
    ctx: str = ""  # the ctx methods that send it (status "scripted")
    reason: str = ""  # one line: why it is not scripted, or what SGLang answered
    known_bug: str = ""  # status "kills": the registry entry

    def refusal(self, route: str) -> str:
        """The one-line refusal ``ctx.post_http`` raises for ``route``."""
        if self.status == "scripted":
            why = f"script it with {self.ctx} (tracked by the op ledger and judged by its contract)"
        elif self.status == "kills":
            why = f"it kills the scheduler on SGLang 0.5.23 (known bug {self.known_bug}: {self.reason})"
        else:
            why = self.reason
        return (f"ctx.post_http({route!r}) refused: {why}; docs/control-requests.md row {self.row}. "
                "Pass unchecked=True to send it anyway")


def _c(type_name: str, row: int, routes: Tuple[str, ...], status: str, **kw: str) -> ControlRequest:
    assert status in STATUSES, status
    return ControlRequest(type_name, row, routes, status, **kw)


CATALOG: Tuple[ControlRequest, ...] = (
    _c("TokenizedGenerateReqInput", 1, ("/generate",), "scripted",
       ctx="ctx.start_req / ctx.send_generate"),
    _c("TokenizedEmbeddingReqInput", 2, ("/encode", "/classify", "/v1/embeddings"), "sglang_refuses",
       reason="the generation model answers 400 'This model does not appear to be an embedding model' "
              "(an embedding server is not a harness topology)"),
    _c("BatchTokenizedGenerateReqInput", 3, (), "internal",
       reason="sent by the tokenizer for a batch of prompts under --enable-tokenizer-batch-encode; "
              "the scheduler handles each item as a generate request (read off the code)"),
    _c("BatchTokenizedEmbeddingReqInput", 4, (), "internal",
       reason="as row 3, for embedding requests (read off the code)"),
    _c("FlushCacheReqInput", 5, ("/flush_cache",), "scripted", ctx="ctx.flush_cache"),
    _c("ClearHiCacheReqInput", 6, ("/hicache/storage-backend/clear",), "sglang_refuses",
       reason="400 without HiCache storage (its body says 'Hierarchical cache storage backend cleared.')"),
    _c("AttachHiCacheStorageReqInput", 7, ("/hicache/storage-backend",), "sglang_refuses",
       reason="400 'Hierarchical cache is not enabled.' on the CPU default"),
    _c("DetachHiCacheStorageReqInput", 8, ("/hicache/storage-backend",), "sglang_refuses",
       reason="400 'Hierarchical cache is not enabled.' on the CPU default"),
    _c("AbortReq", 9, ("/abort_request",), "scripted", ctx="ctx.abort / ctx.abort_all"),
    _c("OpenSessionReqInput", 10, ("/open_session",), "scripted", ctx="ctx.open_session"),
    _c("CloseSessionReqInput", 11, ("/close_session",), "scripted", ctx="ctx.close_session"),
    _c("UpdateWeightFromDiskReqInput", 12, ("/update_weights_from_disk",), "scripted",
       ctx="ctx.update_weights_from_disk"),
    _c("InitWeightsUpdateGroupReqInput", 13, ("/init_weights_update_group",), "scripted",
       ctx="ctx.init_weights_update_group (the harness runs the trainer's rank 0 over gloo; pp=1)"),
    _c("DestroyWeightsUpdateGroupReqInput", 14, ("/destroy_weights_update_group",), "scripted",
       ctx="ctx.destroy_weights_update_group"),
    _c("InitWeightsSendGroupForRemoteInstanceReqInput", 15, ("/init_weights_send_group_for_remote_instance",),
       "blocks",
       reason="the scheduler joins a torch process group and waits for the remote instance's ranks, "
              "processes the harness does not run (not scripted yet)"),
    _c("SendWeightsToRemoteInstanceReqInput", 16, ("/send_weights_to_remote_instance",), "kills",
       known_bug="send_weights_without_send_group",
       reason="without an initialized send group the handler raises KeyError instead of refusing"),
    _c("BeginWeightUpdateReqInput", 17, ("/begin_weight_update",), "scripted", ctx="ctx.begin_weight_update"),
    _c("EndWeightUpdateReqInput", 18, ("/end_weight_update",), "scripted", ctx="ctx.end_weight_update"),
    _c("UpdateWeightsFromDistributedReqInput", 19, ("/update_weights_from_distributed",), "scripted",
       ctx="ctx.update_weights_from_distributed (the trainer rank broadcasts; in a begin/end session)"),
    _c("UpdateWeightsFromTensorReqInput", 20, ("/update_weights_from_tensor",), "scripted",
       ctx="ctx.update_weights_from_tensor"),
    _c("UpdateWeightsFromIPCReqInput", 21, ("/update_weights_from_ipc",), "sglang_refuses",
       reason="400 'ImportError checkpoint-engine is not installed'"),
    _c("UpdateWeightVersionReqInput", 22, ("/update_weight_version",), "scripted", ctx="ctx.update_weight_version"),
    _c("GetWeightsByNameReqInput", 23, ("/get_weights_by_name",), "scripted", ctx="ctx.get_weights_by_name"),
    _c("ReleaseMemoryOccupationReqInput", 24, ("/release_memory_occupation",), "scripted",
       ctx="ctx.release_memory_occupation"),
    _c("ResumeMemoryOccupationReqInput", 25, ("/resume_memory_occupation",), "scripted",
       ctx="ctx.resume_memory_occupation"),
    _c("CheckWeightsReqInput", 26, ("/weights_checker",), "scripted", ctx="ctx.check_weights"),
    _c("SlowDownReqInput", 27, ("/slow_down",), "scripted", ctx="ctx.slow_down"),
    _c("PdRoleSwitchReqInput", 28, ("/pd_role_switch",), "sglang_refuses",
       reason="400 '--enable-pd-role-switch is not set on this server' (disaggregation is not a harness topology)"),
    _c("ProfileReq", 29, ("/start_profile", "/stop_profile"), "scripted", ctx="ctx.start_profile / ctx.stop_profile"),
    _c("FreezeGCReq", 30, ("/freeze_gc",), "scripted", ctx="ctx.freeze_gc"),
    _c("ShutdownReq", 31, (), "internal",
       reason="sent by the tokenizer's SIGTERM watchdog on graceful shutdown (read off the code)"),
    _c("GetInternalStateReq", 32, ("/server_info", "/get_server_info"), "scripted", ctx="ctx.server_info"),
    _c("SetInternalStateReq", 33, ("/set_internal_state",), "scripted", ctx="ctx.set_internal_state"),
    _c("GetHiCacheL3LayoutReq", 32, ("/get_hicache_l3_cache_layout",), "sglang_refuses",
       reason="200 {'enabled': False, ..., 'reason': 'Hierarchical cache is disabled'} on the CPU default"),
    _c("RpcReqInput", 34, (), "internal",
       reason="no HTTP route: Engine.collective_rpc only (read off the code)"),
    _c("ExpertDistributionReq", 35, ("/start_expert_distribution_record", "/stop_expert_distribution_record",
                                     "/dump_expert_distribution_record"), "kills",
       known_bug="expert_distribution_route_without_recorder",
       reason="without --expert-distribution-recorder-mode the handler raises"),
    _c("LoadLoRAAdapterReqInput", 36, ("/load_lora_adapter",), "scripted", ctx="ctx.load_lora_adapter"),
    _c("LoadLoRAAdapterFromTensorsReqInput", 37, ("/load_lora_adapter_from_tensors",), "scripted",
       ctx="ctx.load_lora_adapter_from_tensors"),
    _c("UnloadLoRAAdapterReqInput", 38, ("/unload_lora_adapter",), "scripted", ctx="ctx.unload_lora_adapter"),
    _c("PauseGenerationReqInput", 39, ("/pause_generation",), "scripted", ctx="ctx.pause_generation"),
    _c("ContinueGenerationReqInput", 40, ("/continue_generation",), "scripted", ctx="ctx.continue_generation"),
    _c("ConfigureLoggingReq", 41, ("/configure_logging",), "scripted", ctx="ctx.configure_logging"),
    _c("ScaleElasticEPReqInput", 42, ("/scale_elastic_ep",), "sglang_refuses",
       reason="404 'elastic EP is not enabled (set --elastic-ep-backend)'"),
    _c("DumperControlReqInput", 43, ("/dumper/{method}",), "sglang_refuses",
       reason="404 Not Found: the route exists only with DUMPER_SERVER_PORT=reuse"),
    _c("AddExternalCorpusReqInput", 44, ("/add_external_corpus",), "sglang_refuses",
       reason="400 'Ngram speculative decoding is not enabled.'"),
    _c("RemoveExternalCorpusReqInput", 45, ("/remove_external_corpus",), "sglang_refuses",
       reason="400 'Ngram speculative decoding is not enabled.'"),
    _c("ListExternalCorporaReqInput", 46, ("/list_external_corpora",), "sglang_refuses",
       reason="400 'Ngram speculative decoding is not enabled.'"),
)

BY_TYPE: Dict[str, ControlRequest] = {c.type_name: c for c in CATALOG}


def _route_key(route: str) -> str:
    path = route.split("?", 1)[0].rstrip("/") or "/"
    if path.startswith("/dumper/"):
        return "/dumper/{method}"
    return path


def for_route(route: str, method: str = "POST") -> Optional[ControlRequest]:
    """The catalog entry a post to ``route`` reaches, or None (a route no
    control request is sent from: ``/health``, the OpenAI routes...).
    ``/hicache/storage-backend`` is attach (PUT) or detach (DELETE)."""
    key = _route_key(route)
    if key == "/hicache/storage-backend":
        return BY_TYPE["DetachHiCacheStorageReqInput" if method.upper() == "DELETE"
                       else "AttachHiCacheStorageReqInput"]
    for entry in CATALOG:
        if key in entry.routes:
            return entry
    return None


def post_refusal(route: str, method: str = "POST") -> Optional[str]:
    """Why ``ctx.post_http`` refuses ``route``, or None when it sends it."""
    entry = for_route(route, method)
    if entry is None or entry.status not in REFUSED_BY_POST_HTTP:
        return None
    return entry.refusal(route)


def table(entries: Sequence[ControlRequest] = CATALOG) -> str:
    """The catalog as a text table (``scripted-runtime controls``)."""
    lines = [f"{'row':>3}  {'request type':<46} {'status':<15} route: how / why"]
    for c in sorted(entries, key=lambda c: (c.row, c.type_name)):
        how = c.ctx if c.status == "scripted" else (
            f"known bug {c.known_bug}: {c.reason}" if c.status == "kills" else c.reason)
        route = c.routes[0] if c.routes else "(no route)"
        lines.append(f"{c.row:>3}  {c.type_name:<46} {c.status:<15} {route}: {how}")
    counts = {s: sum(c.status == s for c in entries) for s in STATUSES}
    lines.append(f"{len(entries)} request types: " + ", ".join(f"{n} {s}" for s, n in counts.items() if n))
    return "\n".join(lines)
