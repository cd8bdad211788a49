"""What the real SGLang scheduler and a tiny dummy-weight model need on a CPU box.

Measured on 0.5.23 (and 0.5.12.post1 / 0.5.8.post1, see ../shared/DESIGN.md §4):

1. the rotary embedding must take its CPU path, else it imports a CUDA kernel
   (``_is_cpu = True`` in the module that holds the flag);
2. with ``pp_size > 1`` the PyNccl communicator must not be built on CPU
   (gloo carries the PP traffic); ``pynccl_comm`` then stays None.

``SGLANG_CPU_OMP_THREADS_BIND`` is set by the launcher, not here: its format
depends on the release (``sglang_compat.omp_bind_rule``).
"""
from __future__ import annotations

import logging

from hooks import post_import, sglang_compat

logger = logging.getLogger("scripted_runtime.hooks")


def _force_rotary_cpu_path(module) -> None:
    if hasattr(module, "_is_cpu"):
        module._is_cpu = True


def _no_pynccl_on_cpu(module) -> None:
    original = module.PyNcclCommunicator

    def cpu_pynccl_communicator(*args, **kwargs):
        # GroupCoordinator stores whatever this returns as pynccl_comm; None
        # means "no NCCL", which is exactly the CPU situation.
        return None

    cpu_pynccl_communicator.__wrapped__ = original
    module.PyNcclCommunicator = cpu_pynccl_communicator


def install() -> None:
    for name in sglang_compat.ROTARY_CPU_FLAG_MODULES:
        post_import.when_imported(name, _force_rotary_cpu_path)
    post_import.when_imported(sglang_compat.PYNCCL_MODULE, _no_pynccl_on_cpu)
