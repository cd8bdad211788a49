"""Mutants of LoRA serving (issue 35's LoRA family: adapters loaded and
unloaded at run time, two per batch on the ``pp1-lora`` topology), written
with the operations before the explorer drew them: the admission's LoRA
budget and the LoRA memory pool's slots. Their ``expected`` is what should
notice each, measured in the kill table."""
from __future__ import annotations

from typing import Any

from scripted_runtime.hooks.mutants.base import (LORA, LORA_MEM_POOL, find_attr, find_method, find_module, mutant,
                                                 replace_attr, scheduler_class)


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
