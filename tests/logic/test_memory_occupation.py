"""The emulated loss of released memory on CPU (scheduler_side/memory_occupation.py),
on a small torch model and KV buffers (pure logic; against the real scheduler:
tests/server/test_rl_weight_sync.py)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from scripted_runtime.scheduler_side import memory_occupation

torch = pytest.importorskip("torch")


def _scheduler(*, real_saver=False, cpu_backup=False):
    model = torch.nn.Linear(4, 4)
    model.register_buffer("rotary", torch.ones(3))
    k, v = torch.zeros(5, 2), torch.zeros(5, 2)
    saver = type("TorchMemorySaverAdapterReal" if real_saver else "_TorchMemorySaverAdapterNoop", (), {})()
    return SimpleNamespace(
        tp_worker=SimpleNamespace(model_runner=SimpleNamespace(model=model)),
        token_to_kv_pool_allocator=SimpleNamespace(_kvcache=SimpleNamespace(k_buffer=[k], v_buffer=[v])),
        weight_updater=SimpleNamespace(memory_saver_adapter=saver, offload_tags=set()),
        server_args=SimpleNamespace(enable_weights_cpu_backup=cpu_backup),
    )


def req(kind, tags=None):
    return type(kind, (), {"tags": tags})()


def test_a_release_overwrites_what_it_gave_up_until_an_update_loads_the_weights():
    s = _scheduler()
    weight = s.tp_worker.model_runner.model.weight.detach().clone()
    memory_occupation.after_dispatch(s, req("ReleaseMemoryOccupationReqInput", ["kv_cache"]), None)
    k = s.token_to_kv_pool_allocator._kvcache.k_buffer[0]
    assert k.abs().sum() > 0, "released KV kept its content"
    assert torch.equal(s.tp_worker.model_runner.model.weight, weight), "weights were not released"
    assert not memory_occupation.weights_lost(s)
    memory_occupation.after_dispatch(s, req("ReleaseMemoryOccupationReqInput"), None)  # no tags: all
    model = s.tp_worker.model_runner.model
    assert not torch.equal(model.weight, weight) and not torch.equal(model.rotary, torch.ones(3))
    assert memory_occupation.weights_lost(s)
    refused = SimpleNamespace(success=False)
    memory_occupation.after_dispatch(s, req("UpdateWeightFromDiskReqInput"), refused)
    assert memory_occupation.weights_lost(s), "a failed update loaded nothing"
    memory_occupation.after_dispatch(s, req("UpdateWeightFromDiskReqInput"), SimpleNamespace(success=True))
    assert not memory_occupation.weights_lost(s)


def test_nothing_is_overwritten_where_sglang_loses_the_memory_itself_or_keeps_a_backup():
    s = _scheduler(real_saver=True)
    assert memory_occupation.emulate_release(s, ("kv_cache", "weights")) == {}
    s = _scheduler(cpu_backup=True)
    done = memory_occupation.emulate_release(s, ("kv_cache", "weights"))
    assert done == {"kv_cache": 2} and not memory_occupation.weights_lost(s)


def test_the_garbage_is_the_same_every_run():
    a, b = _scheduler(), _scheduler()
    memory_occupation.emulate_release(a, ("kv_cache",))
    memory_occupation.emulate_release(b, ("kv_cache",))
    assert torch.equal(a.token_to_kv_pool_allocator._kvcache.k_buffer[0],
                       b.token_to_kv_pool_allocator._kvcache.k_buffer[0])


def test_the_release_sync_workaround_answers_the_cpu_module_and_can_be_undone(monkeypatch):
    """hooks/cpu_enablement.py item 5: SGLang's argument-less
    torch.get_device_module() in the weight updater names torch's build
    accelerator (CUDA here); the view answers the CPU's, and the known bug's
    scenario can undo it for a block."""
    import sys
    import types

    from scripted_runtime.hooks import cpu_enablement

    module = types.ModuleType(cpu_enablement.WEIGHT_UPDATER_MODULE)
    module.torch = torch
    monkeypatch.setitem(sys.modules, cpu_enablement.WEIGHT_UPDATER_MODULE, module)
    cpu_enablement._release_syncs_served_device(module)
    assert module.torch.get_device_module() is torch.cpu
    assert module.torch.get_device_module("cpu") is torch.cpu and module.torch.zeros is torch.zeros
    cpu_enablement._release_syncs_served_device(module)  # twice: one view
    assert module.torch._real is torch
    with cpu_enablement.without_release_sync_workaround():
        assert module.torch is torch
    assert module.torch.get_device_module() is torch.cpu
