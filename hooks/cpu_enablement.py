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

5. ``release_memory_occupation`` ends with ``torch.get_device_module().
   synchronize()`` (0.5.23 ``scheduler_components/weight_updater.py``): with
   no argument torch names the accelerator it was *built* for, so on a CPU
   server with a CUDA build of torch (this box's cu130 wheel) it calls
   ``torch.cuda.synchronize()`` and the scheduler dies ("Found no NVIDIA
   driver"; in a forked server "Cannot re-initialize CUDA in forked
   subprocess"). The rest of the scheduler asks for the served device
   (``torch.get_device_module(self.device)``); the harness makes this call do
   the same: that module's ``torch`` global becomes a view of torch whose
   argument-less ``get_device_module()`` is the CPU's. The bug is registered
   (``known_bugs``: ``release_memory_syncs_build_device``); its scenario turns
   the workaround off for its run (``without_release_sync_workaround``).

6. LoRA (the ``torch_native`` backend, the one with a CPU path) pins host
   memory unconditionally when it builds its layers and batches
   (``torch.tensor(..., pin_memory=True)``, ``tensor.pin_memory()`` in
   ``sglang_compat.LORA_PIN_MEMORY_MODULES``); a CUDA build of torch raises
   "Found no NVIDIA driver" there, so a CPU server with ``--enable-lora``
   could not start (measured on 0.5.23). Pinning only speeds up copies to a
   GPU; where no CUDA device is available those modules' ``torch`` becomes a
   view whose tensor factories drop ``pin_memory``, and ``Tensor.pin_memory``
   returns the tensor itself (process-wide, only when CUDA is unavailable:
   the call would raise otherwise).

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


WEIGHT_UPDATER_MODULE = "sglang.srt.managers.scheduler_components.weight_updater"


class _ServedDeviceTorch:
    """``torch`` as SGLang's weight updater sees it on a CPU server: the same
    module, except that ``get_device_module()`` with no argument is the CPU's
    (with one, torch's own answer)."""

    def __init__(self, real) -> None:
        self.__dict__["_real"] = real

    def get_device_module(self, device=None):
        if device is None:
            return self._real.cpu
        return self._real.get_device_module(device)

    def __getattr__(self, name):
        return getattr(self._real, name)


def _release_syncs_served_device(module) -> None:
    real = getattr(module, "torch", None)
    if real is None or isinstance(real, _ServedDeviceTorch):
        return
    module.torch = _ServedDeviceTorch(real)


class without_release_sync_workaround:
    """``with cpu_enablement.without_release_sync_workaround(): ...``: the
    weight updater's plain ``torch`` back for the block (in this process), so
    a scenario can show the bug item 5 works around."""

    def __enter__(self):
        self._module = sys.modules.get(WEIGHT_UPDATER_MODULE)
        self._view = getattr(self._module, "torch", None)
        if isinstance(self._view, _ServedDeviceTorch):
            self._module.torch = self._view._real
        return self

    def __exit__(self, *exc):
        if isinstance(self._view, _ServedDeviceTorch):
            self._module.torch = self._view
        return False


_PIN_FACTORIES = ("tensor", "empty", "zeros", "ones", "full", "arange", "empty_like", "zeros_like", "ones_like")


class _UnpinnedTorch:
    """``torch`` as a LoRA module sees it without a CUDA device: the same
    module, except that its tensor factories ignore ``pin_memory``."""

    def __init__(self, real) -> None:
        self.__dict__["_real"] = real
        for name in _PIN_FACTORIES:
            factory = getattr(real, name)
            self.__dict__[name] = _without_pin(factory)

    def __getattr__(self, name):
        return getattr(self._real, name)


def _without_pin(factory):
    def unpinned(*args, **kwargs):
        kwargs.pop("pin_memory", None)
        return factory(*args, **kwargs)

    unpinned.__wrapped__ = factory
    return unpinned


def _no_pinning_without_cuda(module) -> None:
    import torch

    if torch.cuda.is_available():
        return
    real = getattr(module, "torch", None)
    if real is not None and not isinstance(real, _UnpinnedTorch):
        module.torch = _UnpinnedTorch(real)
    original = torch.Tensor.pin_memory
    if getattr(original, "__scripted_runtime_unpinned__", False):
        return

    def pin_memory(self, *args, **kwargs):
        if torch.cuda.is_available():
            return original(self, *args, **kwargs)
        return self

    pin_memory.__scripted_runtime_unpinned__ = True
    pin_memory.__wrapped__ = original
    torch.Tensor.pin_memory = pin_memory


def install() -> None:
    from scripted_runtime.hooks import hicache_cpu

    hicache_cpu.install()  # the hierarchical cache's host pool and copies (hicache_cpu.py)
    for name in sglang_compat.ROTARY_CPU_FLAG_MODULES:
        post_import.when_imported(name, _force_rotary_cpu_path)
    post_import.when_imported(sglang_compat.PYNCCL_MODULE, _no_pynccl_on_cpu)
    post_import.when_imported(WEIGHT_UPDATER_MODULE, _release_syncs_served_device)
    for name in sglang_compat.LORA_PIN_MEMORY_MODULES:
        post_import.when_imported(name, _no_pinning_without_cuda)
    if sglang_compat.needs_sgl_kernel_stub() and not any(
            isinstance(f, _SglKernelFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _SglKernelFinder())
