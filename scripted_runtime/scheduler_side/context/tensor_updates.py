"""Weight updates from tensors, the RL trainer's path (part of ``ctx``):
``begin_weight_update``, ``update_weights_from_tensor``, ``end_weight_update``.

In 0.5.23 a tensor update must run inside a weight-update session
(``SchedulerWeightUpdaterManager``: ``update_weights_from_tensor`` answers
``success=False`` without one). The tensors travel as SGLang's
``MultiprocessingSerializer`` payload, one per TP rank, base64 over HTTP;
on the CPU default they are shared-memory handles of tensors this process
holds (the script runs in the scheduler's process), kept alive on the op
until SGLang has loaded them. The tokenizer takes its writer lock for each
of the three unless generation is paused (as for ``update_weights_from_disk``).
"""
from __future__ import annotations

import os
from typing import Any, List, Optional, Sequence, Tuple

from scripted_runtime.hooks import sglang_compat
from scripted_runtime.protocol import ENV_CHECKPOINT
from scripted_runtime.scheduler_side import runtime_contracts, update_sources
from scripted_runtime.scheduler_side.control import ControlOp


def checkpoint_tensors(path: str) -> List[Tuple[str, Any]]:
    """Every tensor of the safetensors checkpoint at ``path`` (a file or a
    directory of them), as (name, tensor): what a trainer would send."""
    from safetensors.torch import load_file

    files = runtime_contracts.checkpoint_files(path)
    if not files:
        raise ValueError(f"update_weights_from_tensor: no .safetensors file at {path}")
    out: List[Tuple[str, Any]] = []
    for f in files:
        out.extend(load_file(f).items())
    return out


class TensorUpdates:
    """Mixed into ``ScriptContext`` (which provides ``_control``,
    ``released_memory``, ``_refuse_update_behind_lock`` and ``_scheduler``)."""

    def begin_weight_update(self, *, await_arrival: bool = False) -> ControlOp:
        """POST ``/begin_weight_update``: open the session a tensor update
        needs (``success=False`` when one is open already)."""
        if await_arrival:
            self._refuse_update_behind_lock()
        return self._control("begin_weight_update", "/begin_weight_update", {}, "BeginWeightUpdateReqInput",
                             await_arrival=await_arrival)

    def end_weight_update(self, *, await_arrival: bool = False) -> ControlOp:
        """POST ``/end_weight_update``: close the session."""
        if await_arrival:
            self._refuse_update_behind_lock()
        return self._control("end_weight_update", "/end_weight_update", {}, "EndWeightUpdateReqInput",
                             await_arrival=await_arrival)

    @property
    def weight_update_session_open(self) -> bool:
        return sglang_compat.weight_update_session_open(self._scheduler)

    def update_weights_from_tensor(self, named_tensors: Optional[Sequence[Tuple[str, Any]]] = None, *,
                                   model_path: Optional[str] = None, flush_cache: bool = True,
                                   await_arrival: bool = False, weight_version: Optional[str] = None) -> ControlOp:
        """POST ``/update_weights_from_tensor`` with ``named_tensors`` (by
        default every tensor of ``model_path``, by default the harness's
        checkpoint: the same weights ``update_weights_from_disk`` loads), one
        serialized copy per TP rank. Run it between ``begin_weight_update``
        and ``end_weight_update``; ``yield from op.wait()`` as for the disk
        update (``await_arrival``: the same rules)."""
        if "weights" in self.released_memory:
            raise RuntimeError(
                "update_weights_from_tensor: the weights memory is released (release_memory_occupation); on a GPU "
                "its pages are unmapped and loading into them faults. Resume it first: "
                "ctx.resume_memory_occupation(['weights'])")
        refused = sglang_compat.cpu_tensor_update_supported(self._scheduler)
        if refused:
            raise RuntimeError(refused)
        path = None
        if named_tensors is None:
            path = model_path or os.environ.get(ENV_CHECKPOINT)
            if not path:
                raise ValueError("update_weights_from_tensor needs named_tensors or model_path (no harness "
                                 "checkpoint is set)")
            named_tensors = checkpoint_tensors(path)
        if await_arrival:
            self._refuse_update_behind_lock()
        named_tensors = list(named_tensors)
        rid = update_sources.note_posted(path)  # the update_weights contract then knows what it loads
        payload = {"serialized_named_tensors": sglang_compat.serialize_named_tensors(self._scheduler, named_tensors),
                   "flush_cache": flush_cache, "abort_all_requests": False, **({"rid": rid} if rid else {}),
                   **({"weight_version": weight_version} if weight_version is not None else {})}
        op = self._control("update_weights_from_tensor", "/update_weights_from_tensor", payload,
                           "UpdateWeightsFromTensorReqInput", rid=rid, await_arrival=await_arrival)
        op.payload = {"flush_cache": flush_cache, "tensors": len(named_tensors)}  # not the handles
        op.keep_alive = named_tensors  # the shared memory the handles name, until SGLang loaded it
        return op
