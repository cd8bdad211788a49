"""What the real SGLang scheduler and a tiny dummy-weight model need on a CPU box.

Measured on 0.5.23 and 0.5.12.post1 / 0.5.8.post1 (docs/sglang-facts.md,
"Running on CPU" and "Older releases"):

1. the rotary embedding must take its CPU path, else it imports a CUDA kernel
   (``_is_cpu = True`` in the module that holds the flag);
2. with ``pp_size > 1`` the PyNccl communicator must not be built on CPU
   (gloo carries the PP traffic); ``pynccl_comm`` then stays None.

3. releases that import ``sgl_kernel`` unconditionally (0.5.12.post1 does, in
   ``mem_cache/memory_pool_host.py``) fail without libcuda: when the real
   package cannot load, it is replaced by a stub whose attributes are mocks
   (what SGLang's own ``maybe_stub_sgl_kernel`` test helper does). The tiny
   CPU model never calls into it; a call would return a mock, not crash.

4. HiCache (``enable_hierarchical_cache``): ``hooks/hicache_cpu.py``.

``SGLANG_CPU_OMP_THREADS_BIND`` is set by the launcher, not here: its format
depends on the release (``sglang_compat.omp_bind_rule``).
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import sys

from scripted_runtime.hooks import post_import, sglang_compat

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


def _stub_module(module, reason: str) -> None:
    from unittest.mock import MagicMock

    module.__path__ = []
    module.__getattr__ = lambda name: MagicMock(name=f"{module.__name__}.{name}")
    module.__scripted_runtime_stub__ = reason


class _StubLoader(importlib.abc.Loader):
    """Loads the real module; if that raises ImportError/OSError, the module
    becomes a stub instead (and its submodules are stubs too)."""

    def __init__(self, real: "importlib.abc.Loader | None") -> None:
        self._real = real

    def create_module(self, spec):
        return self._real.create_module(spec) if self._real is not None else None

    def exec_module(self, module) -> None:
        if self._real is None:
            _stub_module(module, "parent package stubbed")
            return
        try:
            self._real.exec_module(module)
        except (ImportError, OSError) as exc:
            logger.warning("sgl_kernel cannot load on this machine (%s); using a stub", exc)
            _stub_module(module, str(exc))


class _SglKernelFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        root = sglang_compat.SGL_KERNEL_MODULE
        if fullname != root and not fullname.startswith(root + "."):
            return None
        parent = sys.modules.get(root)
        if fullname != root and getattr(parent, "__scripted_runtime_stub__", None):
            return importlib.machinery.ModuleSpec(fullname, _StubLoader(None), is_package=True)
        spec = post_import.find_spec_elsewhere(self, fullname, path, target)
        if spec is not None:
            spec.loader = _StubLoader(spec.loader)
            return spec
        if fullname == root:  # not installed at all
            return importlib.machinery.ModuleSpec(fullname, _StubLoader(None), is_package=True)
        return None


def install() -> None:
    from scripted_runtime.hooks import hicache_cpu

    hicache_cpu.install()  # the hierarchical cache's host pool and copies (hicache_cpu.py)
    for name in sglang_compat.ROTARY_CPU_FLAG_MODULES:
        post_import.when_imported(name, _force_rotary_cpu_path)
    post_import.when_imported(sglang_compat.PYNCCL_MODULE, _no_pynccl_on_cpu)
    if sglang_compat.needs_sgl_kernel_stub() and not any(
            isinstance(f, _SglKernelFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _SglKernelFinder())
