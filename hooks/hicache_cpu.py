"""What SGLang's hierarchical cache (HiCache) needs to run on a CPU box
(0.5.23; measured: docs/sglang-facts.md, "HiCache on CPU"). Installed with
the rest of the CPU enablement (``cpu_enablement.install``); both patches
only touch what CPU cannot do and leave every scheduling decision alone.

1. ``pool_host/common.py``: a pinned host pool is registered with
   ``cudaHostRegister`` through ``torch.cuda.cudart()``, which dies without a
   CUDA driver. On CPU the host pool is ordinary memory already; registering
   it is a no-op that records no ranges (and unregistering it too).
2. ``pool_host/mha.py`` binds its ``transfer_kv_*`` copies from
   ``sgl_kernel.kvcacheio`` on CUDA/ROCm only, so the first backup dies with
   a ``NameError``. With ``hicache_io_backend=direct`` and
   ``hicache_mem_layout=layer_first`` (the CPU defaults,
   ``scripted_runtime/user_side/engine_config.py``) only
   ``transfer_kv_direct`` is called: a torch stand-in with its signature
   (per layer: ``index_select`` from the source, ``index_copy_`` into the
   destination) is bound there. The other layouts need pointer-table
   kernels that exist only for CUDA/HIP: the launcher refuses them on CPU.

Streams and events need nothing: on CPU the device module is ``torch.cpu``,
whose ``Stream``/``Event`` do nothing and ``Event.query()`` is True, so a
copy completes where it is issued.
"""
from __future__ import annotations

import logging
from typing import Any, Sequence

from scripted_runtime.hooks import post_import

logger = logging.getLogger("scripted_runtime.hooks")

POOL_HOST_COMMON = "sglang.srt.mem_cache.pool_host.common"
POOL_HOST_MHA = "sglang.srt.mem_cache.pool_host.mha"


def transfer_kv_direct(src_layers: Sequence[Any], dst_layers: Sequence[Any], src_indices: Any, dst_indices: Any,
                       page_size: int = 1, **_: Any) -> None:
    """``sgl_kernel.kvcacheio.transfer_kv_direct`` in torch: copy the rows
    ``src_indices`` of each source layer to the rows ``dst_indices`` of the
    matching destination layer (any page size: indices are per token)."""
    if len(src_layers) != len(dst_layers):
        raise ValueError(f"transfer_kv_direct: {len(src_layers)} source layers, {len(dst_layers)} destination")
    for src, dst in zip(src_layers, dst_layers):
        rows = src.index_select(0, src_indices.to(src.device).long())
        dst.index_copy_(0, dst_indices.to(dst.device).long(), rows.to(dst.device, dst.dtype))


def _no_host_register(module: Any) -> None:
    def _cuda_host_register(buffer: Any, registration_granularity_bytes: Any = None) -> None:
        return None  # CPU memory: nothing to pin, no ranges recorded

    def _cuda_host_unregister(buffer: Any) -> None:
        return None

    for name, replacement in (("_cuda_host_register", _cuda_host_register),
                              ("_cuda_host_unregister", _cuda_host_unregister)):
        original = getattr(module, name, None)
        if original is None:
            logger.warning("HiCache on CPU: %s.%s not found; pinned host pools may fail", module.__name__, name)
            continue
        replacement.__wrapped__ = original
        setattr(module, name, replacement)


def _direct_transfer(module: Any) -> None:
    if getattr(module, "transfer_kv_direct", None) is None:
        module.transfer_kv_direct = transfer_kv_direct


def install() -> None:
    post_import.when_imported(POOL_HOST_COMMON, _no_host_register)
    post_import.when_imported(POOL_HOST_MHA, _direct_transfer)
