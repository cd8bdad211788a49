"""The ``lora`` contract (scheduler process): what must hold around LoRA
adapters loaded and unloaded at run time, read off SGLang 0.5.23
(``lora/lora_manager.py``, ``managers/scheduler.py``'s
``_can_schedule_lora_req``, ``managers/tokenizer_control_mixin.py``):

* **every forward holds at most ``max_loras_per_batch`` adapters** (the
  base model, ``lora_id`` None, counts as one: SGLang's admission checks
  ``{req.lora_id} | running_loras`` with ``validate_lora_batch``, and
  ``fetch_new_loras`` asserts the same bound when the forward's adapters are
  put in the memory pool);
* **an unfinished request's adapter is loaded**: SGLang's tokenizer stops
  new requests from naming an adapter being unloaded and sends the unload
  only after every request using it has finished, so the scheduler never
  holds a live request whose adapter is gone;
* ``load_lora_adapter`` that answers success leaves the adapter loaded
  (its ``lora_id`` in the LoRA manager); ``unload_lora_adapter`` that
  answers success leaves it gone, and an unload of a loaded adapter is not
  refused (its users have finished, by the tokenizer's wait).

The dispatch rules are judged in the dispatcher (``LoraMemory``), the
forward and request rules once an iteration (``check``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from scripted_runtime.hooks import sglang_compat
from scripted_runtime.scheduler_side import check_registry
from scripted_runtime.scheduler_side.check_registry import Violation

NAME = "lora"
DOC = ("every forward holds at most max_loras_per_batch adapters; an unfinished request's adapter is loaded; "
       "a load or unload that succeeded left the adapter loaded or gone")
LOAD_TYPE = "LoadLoRAAdapterReqInput"
UNLOAD_TYPE = "UnloadLoRAAdapterReqInput"
LOAD_TENSORS_TYPE = "LoadLoRAAdapterFromTensorsReqInput"
LOAD_OPS = {LOAD_TYPE: "load_lora_adapter", LOAD_TENSORS_TYPE: "load_lora_adapter_from_tensors"}


@dataclass
class LoraMemory:
    """What the contract remembers across the iterations of one run."""

    TYPES = frozenset({LOAD_TYPE, LOAD_TENSORS_TYPE, UNLOAD_TYPE})
    problems: List[str] = field(default_factory=list)  # found at dispatch
    batch_cursor: int = 0

    def before_dispatch(self, s: Any, recv_req: Any) -> Any:
        return sglang_compat.loaded_loras(s)

    def on_dispatch(self, s: Any, recv_req: Any, output: Any, step: int, before: Dict[str, str]) -> None:
        kind = type(recv_req).__name__
        success = bool(getattr(output, "success", False))
        lora_id, name = getattr(recv_req, "lora_id", None), getattr(recv_req, "lora_name", None)
        after = sglang_compat.loaded_loras(s)
        if kind in LOAD_OPS and success and lora_id not in after:
            self.problems.append(f"{LOAD_OPS[kind]}({name!r}) answered success, yet the LoRA manager does not "
                                 f"hold it (loaded: {sorted(after.values())})")
        elif kind == UNLOAD_TYPE:
            if success and lora_id in after:
                self.problems.append(f"unload_lora_adapter({name!r}) answered success, yet the LoRA manager still "
                                     "holds it")
            elif not success and lora_id in before:
                message = getattr(output, "error_message", "") or ""
                self.problems.append(f"unload_lora_adapter({name!r}) of a loaded adapter whose requests had "
                                     f"finished was refused: {message[:160]!r}")


def _adapters_of(reqs: List[Any]) -> List[Any]:
    seen: List[Any] = []
    for r in reqs:
        lora_id = getattr(r, "lora_id", None)
        if lora_id not in seen:
            seen.append(lora_id)
    return seen


@check_registry.contract(NAME, docs={NAME: DOC})
def check(view: Any, memory: Any) -> Optional[Violation]:
    mem: LoraMemory = memory.lora
    inputs = memory.step_inputs
    if not inputs.enabled(NAME):
        mem.problems.clear()
        mem.batch_cursor = len(inputs.batch_log)
        return None
    if mem.problems:
        message = mem.problems[0]
        mem.problems.clear()
        return Violation(NAME, message, {})
    s = view.s
    launched = inputs.launched_since(mem)
    if not sglang_compat.lora_enabled(s):
        return None
    limit = sglang_compat.max_loras_per_batch(s)
    by_rid = {r.rid: r for r in view.reqs}
    for b in launched:
        reqs = [by_rid[rid] for rid in b.rids if rid in by_rid]
        adapters = _adapters_of(reqs)
        if limit and len(adapters) > limit:
            names = sglang_compat.loaded_loras(s)
            shown = ", ".join("base" if a is None else names.get(a, str(a)[:8]) for a in adapters)
            return Violation(NAME, f"a {b.mode} forward launched at step {b.step} holds {len(adapters)} adapters "
                                   f"({shown}): max_loras_per_batch is {limit}", view.owner_info(reqs))
    loaded = sglang_compat.loaded_loras(s)
    for r in view.reqs:
        lora_id = getattr(r, "lora_id", None)
        if lora_id is None or lora_id in loaded or r.finished():
            continue
        return Violation(NAME, f"request {r.rid} is unfinished and its adapter ({str(lora_id)[:8]}) is not loaded "
                               f"(loaded: {sorted(loaded.values())})", view.owner_info([r]))
    return None


def adapter_tag(scheduler: Any, lora_id: Any) -> Tuple[Optional[str], Optional[str]]:
    """(name, folder) of a loaded adapter, (None, None) for the base model
    or an adapter no longer loaded."""
    manager = sglang_compat.lora_manager(scheduler)
    ref = dict(getattr(manager, "lora_refs", {}) or {}).get(lora_id) if manager is not None else None
    if ref is None:
        return None, None
    return ref.lora_name, getattr(ref, "lora_path", None)
