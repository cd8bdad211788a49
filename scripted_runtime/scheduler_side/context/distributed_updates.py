"""Weight updates broadcast by a trainer rank, the path RL frameworks use
with a process group (part of ``ctx``): ``init_weights_update_group``,
``update_weights_from_distributed``, ``destroy_weights_update_group``.

The harness plays the trainer (``weight_trainer``): a process of its own
that joins the group as rank 0 over gloo on 127.0.0.1 (the CPU default;
SGLang's default backend is nccl) and broadcasts a checkpoint's tensors
while the scheduler's handler receives them. In 0.5.23 the update must run
inside a weight-update session (``begin_weight_update`` ..
``end_weight_update``), as a tensor update does; the tokenizer takes its
writer lock for it unless generation is paused (as for the disk update).
"""
from __future__ import annotations

import os
from typing import Any, Optional, Tuple

from scripted_runtime.hooks import sglang_compat
from scripted_runtime.protocol import ENV_CHECKPOINT
from scripted_runtime.scheduler_side import update_sources
from scripted_runtime.scheduler_side.context.tensor_updates import checkpoint_tensors
from scripted_runtime.scheduler_side.control import ControlOp

DEFAULT_GROUP = "harness_trainer"


class DistributedUpdates:
    """Mixed into ``ScriptContext`` (which provides ``_control``,
    ``released_memory``, ``_refuse_update_behind_lock``, ``_scheduler`` and
    ``weight_trainer``)."""

    @property
    def weight_update_groups(self) -> Tuple[str, ...]:
        """The weight-update groups the scheduler joined and has not destroyed."""
        return sglang_compat.weight_update_groups(self._scheduler)

    def _refuse_distributed(self, what: str) -> None:
        refused = sglang_compat.distributed_update_supported(self._scheduler)
        if refused:
            raise RuntimeError(f"{what}: {refused}")
        if self.weight_trainer.error:
            raise RuntimeError(f"{what}: the trainer rank failed earlier: {self.weight_trainer.error}")

    def init_weights_update_group(self, group_name: str = DEFAULT_GROUP, *, backend: str = "gloo") -> ControlOp:
        """Start the harness's trainer rank (once per server: it imports
        torch and SGLang, 5-15 s on 2 cores), have it wait for the scheduler
        as rank 0 of a two-rank group, and post ``/init_weights_update_group``
        (the scheduler joins as rank 1 when the next iteration processes it;
        SGLang's handler blocks until the group formed). Raises under PP
        (every stage would claim the same rank) and for a group joined or
        being joined."""
        self._refuse_distributed("init_weights_update_group")
        if group_name in self.weight_update_groups or group_name in self.weight_trainer.joining:
            raise RuntimeError(f"init_weights_update_group: group {group_name!r} is joined or being joined; "
                               "destroy it first (ctx.destroy_weights_update_group)")
        port = self.weight_trainer.join(group_name, backend)
        payload = {"master_address": "127.0.0.1", "master_port": port, "rank_offset": 1, "world_size": 2,
                   "group_name": group_name, "backend": backend}
        return self._control("init_weights_update_group", "/init_weights_update_group", payload,
                             "InitWeightsUpdateGroupReqInput")

    def update_weights_from_distributed(self, group_name: str = DEFAULT_GROUP, *,
                                        model_path: Optional[str] = None, flush_cache: bool = True,
                                        await_arrival: bool = False,
                                        weight_version: Optional[str] = None) -> ControlOp:
        """POST ``/update_weights_from_distributed`` naming every tensor of
        ``model_path`` (by default the harness's checkpoint: the weights
        ``update_weights_from_disk`` loads); the trainer broadcasts them when
        the scheduler's handler receives (a session open and the group
        joined; otherwise SGLang answers ``success=False`` and nothing is
        sent). Run it between ``begin_weight_update`` and
        ``end_weight_update``; ``yield from op.wait()`` as for the disk
        update (``await_arrival``: the same rules)."""
        self._refuse_distributed("update_weights_from_distributed")
        if "weights" in self.released_memory:
            raise RuntimeError(
                "update_weights_from_distributed: the weights memory is released (release_memory_occupation); on "
                "a GPU its pages are unmapped and loading into them faults. Resume it first: "
                "ctx.resume_memory_occupation(['weights'])")
        path = model_path or os.environ.get(ENV_CHECKPOINT)
        if not path:
            raise ValueError("update_weights_from_distributed needs model_path (no harness checkpoint is set)")
        tensors = checkpoint_tensors(path)
        if await_arrival:
            self._refuse_update_behind_lock()
        names = [name for name, _ in tensors]
        rid = update_sources.note_posted(path)  # the update_weights contract then knows what it loads
        payload = {"names": names, "dtypes": [str(t.dtype).removeprefix("torch.") for _, t in tensors],
                   "shapes": [list(t.shape) for _, t in tensors], "group_name": group_name,
                   "flush_cache": flush_cache, "abort_all_requests": False, "rid": rid,
                   **({"weight_version": weight_version} if weight_version is not None else {})}
        self.weight_trainer.expect_broadcast(group_name, path, names)
        op = self._control("update_weights_from_distributed", "/update_weights_from_distributed", payload,
                           sglang_compat.DISTRIBUTED_UPDATE_TYPE, rid=rid, await_arrival=await_arrival)
        op.payload = {"group_name": group_name, "flush_cache": flush_cache, "tensors": len(names)}
        return op

    def destroy_weights_update_group(self, group_name: str = DEFAULT_GROUP) -> ControlOp:
        """POST ``/destroy_weights_update_group``; the trainer leaves the group
        once the scheduler destroyed its side (SGLang answers
        ``success=False`` for a group it has not joined)."""
        return self._control("destroy_weights_update_group", "/destroy_weights_update_group",
                             {"group_name": group_name}, "DestroyWeightsUpdateGroupReqInput")
