"""release/resume_memory_occupation, the RL weight-sync cycle's memory steps
(scheduler process, every rank).

What SGLang does (0.5.23 ``scheduler_components/weight_updater.py``):
``release_memory_occupation(tags)`` asserts the engine idle
(``is_fully_idle(ignore_waiting=<paused>)``), records the tags in
``offload_tags``, and per tag: ``kv_cache`` flushes the cache and pauses
the KV region; ``weights`` stashes the model's buffers (its "static state")
and pauses the weights region; ``cuda_graph`` pauses the graphs' region.
``resume_memory_occupation(tags)`` undoes it in reverse, putting the
stashed buffers back. No tags means all three.

"Pause a region" is torch_memory_saver's: on a GPU with
``--enable-memory-saver`` the region's physical memory is unmapped and its
content is gone (SGLang issue 6367, a maintainer: "we direct release the
physical memory and re-mem-allocate one during resume. So the params paused
are not protected. You have to rebuild the weights by
update_weights_from_disk and flush the radix cache"), unless the weights
were loaded with a CPU backup (``--enable-weights-cpu-backup``). On the
CPU default SGLang's adapter is a no-op, so released memory keeps its
bytes, and a bug that reads KV or weights across a release would pass
unseen here and corrupt output on a GPU.

So the harness **emulates the loss** where SGLang's adapter is the no-op:
right after a release is processed on a rank, it overwrites what the
release gave up with deterministic garbage: for ``kv_cache`` the KV pool's
data buffers (every layer's K and V), for ``weights`` (without a CPU backup)
every parameter and buffer of the model, after SGLang stashed the buffers,
so its resume puts them back as on a GPU. Parameters stay garbage until a
weight update loads them (``weights_lost``), as on a GPU. The output oracle
then sees any read of lost memory. ``req_to_token`` (also in the KV region)
is left alone: garbage indices would crash a correct engine's reads of
freed rows rather than test anything.
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

from scripted_runtime.hooks import sglang_compat

RELEASE_TYPE = "ReleaseMemoryOccupationReqInput"
RESUME_TYPE = "ResumeMemoryOccupationReqInput"
GARBAGE_SEED = 1234
GARBAGE_SCALE = 3.0  # far outside the construction's weights (about 0.1-1): reading any of it shows

# Per rank (scheduler id): whether a release emulated the loss of the weights and no
# weight update has loaded them since.
_weights_lost: Dict[int, bool] = {}


def tags_of(recv_req: Any) -> Tuple[str, ...]:
    """The tags a release/resume request names (all of them when none)."""
    tags = getattr(recv_req, "tags", None)
    return tuple(tags) if tags else sglang_compat.MEMORY_TAGS


def weights_lost(scheduler: Any) -> bool:
    """Whether this rank's weights are garbage since an emulated release and
    no weight update has loaded them yet (a forward now would run on them,
    as it would on a GPU)."""
    return _weights_lost.get(id(scheduler), False)


def after_dispatch(scheduler: Any, recv_req: Any, output: Any) -> None:
    """Called by every rank's dispatcher wrapper after SGLang handled
    ``recv_req``: emulate the loss of released memory; note a weight update
    that loaded the weights again."""
    kind = type(recv_req).__name__
    if kind == RELEASE_TYPE:
        emulate_release(scheduler, tags_of(recv_req))
    elif kind.startswith("UpdateWeight") and bool(getattr(output, "success", False)):
        _weights_lost.pop(id(scheduler), None)


def emulate_release(scheduler: Any, tags: Tuple[str, ...]) -> Dict[str, int]:
    """Overwrite what a release of ``tags`` gave up, where SGLang itself
    does not (its memory saver is the no-op); returns the tensors overwritten
    per tag."""
    done: Dict[str, int] = {}
    if sglang_compat.memory_saver_is_real(scheduler):
        return done
    import torch

    generator = torch.Generator(device="cpu").manual_seed(GARBAGE_SEED)
    if "kv_cache" in tags:
        done["kv_cache"] = _overwrite(sglang_compat.kv_data_buffers(scheduler), generator)
    if "weights" in tags and not sglang_compat.weights_cpu_backup(scheduler):
        model = sglang_compat.served_model(scheduler)
        if model is not None:
            tensors = [p for _, p in model.named_parameters()] + [b for _, b in model.named_buffers()]
            done["weights"] = _overwrite(tensors, generator)
            _weights_lost[id(scheduler)] = True
    return done


def _overwrite(tensors: Any, generator: Any) -> int:
    import torch

    count = 0
    with torch.no_grad():
        for t in tensors:
            if t is None or not t.is_floating_point() or t.numel() == 0:
                continue
            noise = torch.randn(t.shape, generator=generator, dtype=torch.float32) * GARBAGE_SCALE
            t.copy_(noise.to(device=t.device, dtype=t.dtype))
            count += 1
    return count


def forget(scheduler: Optional[Any] = None) -> None:
    """Drop what is known about lost weights (a rank's, or all: tests)."""
    if scheduler is None:
        _weights_lost.clear()
    else:
        _weights_lost.pop(id(scheduler), None)
