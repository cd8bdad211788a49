"""Mutants of LoRA serving (issue 35's LoRA family: adapters loaded and
unloaded at run time, two per batch on the ``pp1-lora`` topology), written
with the operations before the explorer drew them: the admission's LoRA
budget and the LoRA memory pool's slots; and one written with the load
from tensors (``load_lora_adapter_from_tensors``, grammar 11), before the
explorer drew it. Their ``expected`` is what should notice each, measured
in the kill table."""
from __future__ import annotations

from typing import Any

from scripted_runtime.hooks.mutants.base import (LORA, LORA_ADAPTER, LORA_MEM_POOL, find_attr, find_method,
                                                 find_module, mutant, replace_attr, scheduler_class)


@mutant("mut_lora_admission_forgets_running", topologies=LORA,
        summary="LoRA admission checks a waiting request's adapter alone, not with the adapters already running",
        expected="crash (fetch_new_loras asserts more adapters than slots), contract lora (a forward holds more "
                 "adapters than max_loras_per_batch)")
def _install_mut_lora_admission_forgets_running(scheduler_module: Any) -> None:
    """``Scheduler.can_schedule_lora_req`` asks the LoRA manager whether
    ``{req.lora_id}`` fits the memory pool, not ``{req.lora_id} |
    running_loras``: a third adapter's request is admitted beside two
    running ones when the pool has two slots.

    Plausible: the union is one operator in a long condition, and a batch of
    one adapter (every test of the feature) passes either way.

    Seen by: SGLang's own assert when the forward's adapters are fetched
    into the pool (``fetch_new_loras``), or the ``lora`` contract's forward
    bound, once three adapters' requests are live together."""
    name = "mut_lora_admission_forgets_running"
    cls = scheduler_class(scheduler_module, name)
    original = find_method(cls, "can_schedule_lora_req", name, ("req", "running_loras"))

    def can_schedule_lora_req(self, req, running_loras):
        if req.lora_id in running_loras:
            return original(self, req, running_loras)
        return original(self, req, set())  # MUTANT: the running adapters forgotten

    replace_attr(cls, "can_schedule_lora_req", can_schedule_lora_req, original)


@mutant("mut_lora_slot_keeps_stale_weights", topologies=LORA,
        summary="a LoRA memory-pool slot that held an adapter before is given to another without copying its weights",
        expected="output oracle (a request served with an adapter outputs another adapter's tokens)")
def _install_mut_lora_slot_keeps_stale_weights(scheduler_module: Any) -> None:
    """``LoRAMemoryPool.load_lora_weight_to_buffer`` copies an adapter's
    weights into a slot only the first time the slot gets an adapter: a slot
    an evicted adapter held keeps that adapter's weights when the next one
    is mapped to it.

    Plausible: "the buffers were already written" looks like a cheap
    optimization when one adapter at a time is evicted and brought back, and
    the mapping (``uid_to_buffer_id``) is right, so nothing that reads the
    mapping notices.

    Seen by: the output oracle, comparing a request served with an adapter
    with that adapter's reference run, once three adapters have rotated
    through the two slots."""
    name = "mut_lora_slot_keeps_stale_weights"
    scheduler_class(scheduler_module, name)
    cls = find_attr(find_module(LORA_MEM_POOL, name), "LoRAMemoryPool", name, f"{LORA_MEM_POOL}.LoRAMemoryPool")
    original = find_method(cls, "load_lora_weight_to_buffer", name, ("uid", "buffer_id", "lora_adapter"))

    def load_lora_weight_to_buffer(self, uid, buffer_id, lora_adapter, *args, **kwargs):
        written = self.__dict__.setdefault("_mut_written_slots", set())
        if uid is not None and buffer_id in written:
            return None  # MUTANT: the slot keeps the weights of the adapter it held before
        if uid is not None:
            written.add(buffer_id)
        return original(self, uid, buffer_id, lora_adapter, *args, **kwargs)

    replace_attr(cls, "load_lora_weight_to_buffer", load_lora_weight_to_buffer, original)


@mutant("mut_lora_tensor_load_unnormalized", topologies=LORA,
        summary="an adapter loaded from tensors skips the weight normalization the file loader runs (q/k/v and "
                "gate/up not stacked into the fused modules)",
        expected="output oracle (a request served with an adapter loaded from tensors outputs what its files do not), "
                 "crash")
def _install_mut_lora_tensor_load_unnormalized(scheduler_module: Any) -> None:
    """``LoRAAdapter.initialize_weights_from_tensors`` processes each tensor
    (``_process_weight``) but does not call ``_normalize_weights()``, which
    the file loader (``initialize_weights``) runs after the same loop: the
    adapter's ``q_proj``/``k_proj``/``v_proj`` (and ``gate_proj``/``up_proj``)
    weights stay under their own names instead of the fused ``qkv_proj``
    (``gate_up_proj``) the model's LoRA layers and the memory pool read.

    Plausible: the tensor path is the newer, shorter copy of the file path's
    loop (the RL trainer's), and an adapter on one projection per fused
    module looks loaded: the load answers success and the adapter is in the
    manager.

    Seen by: the output oracle, comparing a request served with the adapter
    loaded from its tensors with the reference of the same adapter loaded
    from its files (the pool's fused slots hold no weights of it, so it
    serves the base model's tokens or other ones), or a crash where the
    memory pool looks the fused name up."""
    name = "mut_lora_tensor_load_unnormalized"
    scheduler_class(scheduler_module, name)
    cls = find_attr(find_module(LORA_ADAPTER, name), "LoRAAdapter", name, f"{LORA_ADAPTER}.LoRAAdapter")
    original = find_method(cls, "initialize_weights_from_tensors", name, ("tensors",))
    find_method(cls, "_process_weight", name, ("name", "loaded_weight"))

    def initialize_weights_from_tensors(self, tensors):
        for tensor_name, tensor in tensors.items():
            self._process_weight(tensor_name, tensor)
        # MUTANT: self._normalize_weights() is not called

    replace_attr(cls, "initialize_weights_from_tensors", initialize_weights_from_tensors, original)
