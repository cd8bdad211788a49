"""The output oracle's references on disk (scheduler_side/reference_cache.py):
a reference one server computed is read back by the next server of the same
key, and a changed key (another dtype, an edited SGLang file, a patch, a new
checkpoint) finds nothing and recomputes."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from scripted_runtime.scheduler_side import output_oracle, reference_cache
from scripted_runtime.scheduler_side.reference_cache import ReferenceCache

FP = (0.125, -3.5, 7.0)
PROMPT = (5, 6, 7)
ENTRY = ([11, 12, 13], 3, {"input": [None, -1.5, -0.25], "output": [-0.5, -2.0, -0.125]})


def _scheduler(**args):
    fields = {"model_path": "", "dtype": "float32", "device": "cpu", "pp_size": 1,
              "disable_overlap_schedule": False, "chunked_prefill_size": 64}
    fields.update(args)
    return SimpleNamespace(server_args=SimpleNamespace(**fields))


def test_a_reference_written_by_one_server_is_read_by_the_next_of_the_same_key(tmp_path):
    key = reference_cache.key_of(_scheduler())
    ReferenceCache(tmp_path, key).put(FP, PROMPT, ENTRY)
    fresh = ReferenceCache(tmp_path, reference_cache.key_of(_scheduler()))  # another server process
    assert fresh.path == ReferenceCache(tmp_path, key).path
    assert fresh.get(FP, PROMPT) == ENTRY
    assert fresh.get(FP, (5, 6)) is None, "another prompt"
    assert fresh.get((0.0, 0.0, 0.0), PROMPT) is None, "other weights"
    assert fresh.get(None, PROMPT) is None


@pytest.mark.parametrize("change", [
    {"dtype": "bfloat16"},
    {"tp_size": 2},
    {"chunked_prefill_size": 32},
])
def test_a_changed_engine_argument_is_another_key_and_recomputes(tmp_path, change):
    ReferenceCache(tmp_path, reference_cache.key_of(_scheduler())).put(FP, PROMPT, ENTRY)
    other = ReferenceCache(tmp_path, reference_cache.key_of(_scheduler(**change)))
    assert other.get(FP, PROMPT) is None
    other.put(FP, PROMPT, ([1], 1))
    assert len(list(tmp_path.glob("*.json"))) == 2, "each key has its own file"


def test_another_torch_thread_count_is_another_key(tmp_path, monkeypatch):
    """A CPU server runs one thread per process unless the user's
    OMP_NUM_THREADS says otherwise (user_side/server.py CPU_THREAD_ENV); a
    reduction split over more threads may round differently, so references
    computed under another count are not read."""
    import torch

    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    ReferenceCache(tmp_path, reference_cache.key_of(_scheduler())).put(FP, PROMPT, ENTRY)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    assert ReferenceCache(tmp_path, reference_cache.key_of(_scheduler())).get(FP, PROMPT) is None


def test_a_cpu_server_runs_one_thread_per_process_unless_the_user_says(monkeypatch):
    from scripted_runtime.user_side import server

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert server.shared_environment("cpu")[0]["OMP_NUM_THREADS"] == "1"
    assert "OMP_NUM_THREADS" not in server.shared_environment("cuda")[0]  # SGLang sets 1 itself off CPU
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert server.shared_environment("cpu")[0]["OMP_NUM_THREADS"] == "2"


@pytest.mark.parametrize("change", [{"pp_size": 4}, {"disable_overlap_schedule": True},
                                    {"pp_size": 4, "pp_async_batch_depth": 1}])
def test_the_pipeline_topology_is_the_same_key(change):
    """A pipeline stage runs the same layers on the same inputs: the CPU
    default's references were measured identical on the three topologies,
    so a pp4 server reads what a pp1 server computed (and checks one)."""
    assert reference_cache.key_of(_scheduler(**change)) == reference_cache.key_of(_scheduler())


def _server_with_entry_on_disk(monkeypatch, tmp_path):
    """A fresh server process's oracle state (nothing in memory, counts at
    0, weights ``FP``) whose disk cache in ``tmp_path`` holds ``ENTRY`` for
    ``PROMPT``; its scheduler."""
    monkeypatch.setenv(reference_cache.ENV_CACHE, str(tmp_path))
    scheduler = _scheduler()
    monkeypatch.setattr(output_oracle, "weights_fingerprint", lambda s: FP)
    monkeypatch.setattr(output_oracle, "_references", {})
    monkeypatch.setattr(output_oracle, "_disk", {})
    monkeypatch.setattr(output_oracle, "computed", {"references": 0, "from_cache": 0, "cache_rejected": 0})
    ReferenceCache(tmp_path, output_oracle.cache_key(scheduler)).put(FP, PROMPT, ENTRY)
    return scheduler


def _verify(monkeypatch, tmp_path, live):
    """``output_oracle.verify_disk_cache`` on a server whose own run of the
    prompt gives ``live``, with ``ENTRY`` in its disk cache."""
    scheduler = _server_with_entry_on_disk(monkeypatch, tmp_path)

    def run_alone(ctx, prompt, n):
        return live
        yield  # a generator, as the real one

    monkeypatch.setattr(output_oracle, "_run_alone", run_alone)
    ctx = SimpleNamespace(scheduler=scheduler)
    gen = output_oracle.verify_disk_cache(ctx, PROMPT, 3)
    with pytest.raises(StopIteration) as stop:
        next(gen)
    return stop.value.value, ctx


def test_a_server_checks_one_cached_reference_before_it_reads_the_cache(tmp_path, monkeypatch):
    kept, ctx = _verify(monkeypatch, tmp_path, ENTRY)
    assert kept is True and output_oracle.computed == {"references": 1, "from_cache": 0, "cache_rejected": 0}
    assert output_oracle.cached_reference(ctx, (9, 9)) is None
    assert output_oracle._disk_cache(ctx.scheduler) is not None, "the cache is read from then on"


def test_a_cache_that_disagrees_with_the_server_is_not_read_again(tmp_path, monkeypatch):
    kept, ctx = _verify(monkeypatch, tmp_path, ([11, 12, 14], 3))
    assert kept is False and output_oracle.computed["cache_rejected"] == 1
    assert output_oracle._disk_cache(ctx.scheduler) is None
    assert output_oracle.cached_reference(ctx, PROMPT) == ([11, 12, 14], 3), "this server's own run, not the file's"


def test_a_patch_a_reverted_fix_or_a_new_checkpoint_is_another_key(tmp_path, monkeypatch):
    from scripted_runtime import protocol
    from scripted_runtime.hooks import fix_toggles, patches

    base = reference_cache.key_of(_scheduler())
    monkeypatch.setenv(patches.ENV_PATCHES, "mut_chunked_row_leak")
    assert reference_cache.key_of(_scheduler()) != base
    mutant = reference_cache.key_of(_scheduler())
    monkeypatch.setenv(patches.ENV_PATCHES, "mut_chunked_row_leak,fence_pp_profiler_stop")
    assert reference_cache.key_of(_scheduler()) == mutant, "a workaround changes no output: the same references"
    mine = tmp_path / "my_mutants.py"
    mine.write_text("def leak(m):\n    pass\n")
    monkeypatch.setenv(patches.ENV_PATCHES, f"{mine}:leak")
    own = reference_cache.key_of(_scheduler())
    mine.write_text("def leak(m):\n    m.x = 1\n")  # the user's patch file edited: another build
    assert reference_cache.key_of(_scheduler()) != own
    monkeypatch.delenv(patches.ENV_PATCHES)
    monkeypatch.setenv(fix_toggles.ENV_REVERT_FIXES, "pr17850")
    assert reference_cache.key_of(_scheduler()) != base
    monkeypatch.delenv(fix_toggles.ENV_REVERT_FIXES)
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    (checkpoint / "model.safetensors").write_bytes(b"x" * 10)
    monkeypatch.setenv(protocol.ENV_CHECKPOINT, str(checkpoint))
    first = reference_cache.key_of(_scheduler())
    assert first != base
    (checkpoint / "model.safetensors").write_bytes(b"y" * 11)  # rewritten: new size and time
    assert reference_cache.key_of(_scheduler()) != first
    served = tmp_path / "served"
    served.mkdir()
    (served / "config.json").write_text("{}")
    assert reference_cache.key_of(_scheduler(model_path=str(served))) != reference_cache.key_of(_scheduler())


def test_an_edited_harness_oracle_file_is_another_key(tmp_path):
    oracle = tmp_path / "output_oracle.py"
    oracle.write_text("MARGIN = 1e-3\n")
    before = reference_cache.key_of(_scheduler(), [str(oracle)])
    oracle.write_text("MARGIN = 1e-2\n")  # another comparison rule: references judged otherwise
    assert reference_cache.key_of(_scheduler(), [str(oracle)]) != before


def test_an_edited_sglang_source_file_is_another_key(tmp_path, monkeypatch):
    import sglang

    tree = tmp_path / "sglang"
    tree.mkdir()
    (tree / "__init__.py").write_text("")
    (tree / "scheduler.py").write_text("a = 1\n")
    monkeypatch.setattr(sglang, "__file__", str(tree / "__init__.py"))
    before = reference_cache.key_of(_scheduler())
    (tree / "scheduler.py").write_text("a = 22\n")  # git checkout of another commit, same release
    assert reference_cache.key_of(_scheduler()) != before


def test_two_servers_of_one_key_merge_and_a_bad_file_is_ignored(tmp_path):
    key = reference_cache.key_of(_scheduler())
    live, standby = ReferenceCache(tmp_path, key), ReferenceCache(tmp_path, key)
    live.put(FP, PROMPT, ENTRY)
    standby.put(FP, (9,), ([4], 1, None))  # read before live wrote: merges instead of overwriting
    assert ReferenceCache(tmp_path, key).entries() == {(FP, PROMPT): ENTRY, (FP, (9,)): ([4], 1, None)}
    live.path.write_text("{not json")
    assert ReferenceCache(tmp_path, key).get(FP, PROMPT) is None
    live.path.write_text(json.dumps({"key": {"another": "key"}, "references": [[list(FP), [5, 6, 7], [1], 1]]}))
    assert ReferenceCache(tmp_path, key).get(FP, PROMPT) is None, "a file of another key is not read"


def test_a_server_sees_what_another_live_server_of_its_key_wrote_since(tmp_path):
    key = reference_cache.key_of(_scheduler())
    first, second = ReferenceCache(tmp_path, key), ReferenceCache(tmp_path, key)
    assert first.get(FP, PROMPT) is None  # read: nothing there yet
    second.put(FP, PROMPT, ENTRY)
    assert first.get(FP, PROMPT) == ENTRY, "a miss reads the file again once it changed"
    assert first.get(FP, (1, 2)) is None


def test_the_cache_directory_and_off(tmp_path, monkeypatch):
    monkeypatch.setenv(reference_cache.ENV_CACHE, "off")
    assert reference_cache.cache_dir() is None
    monkeypatch.setenv(reference_cache.ENV_CACHE, str(tmp_path))
    assert reference_cache.cache_dir() == tmp_path
    monkeypatch.delenv(reference_cache.ENV_CACHE)
    assert str(reference_cache.cache_dir()).endswith(".cache/scripted-runtime/references")


def test_the_oracle_reads_a_cached_reference_instead_of_running_one(tmp_path, monkeypatch):
    """``output_oracle.reference`` on a server with the reference in its
    cache: no request is started, the count says where it came from."""
    scheduler = _server_with_entry_on_disk(monkeypatch, tmp_path)

    class Ctx:
        def start_req(self, **kwargs):
            raise AssertionError("a cached reference must not be run again")

    ctx = Ctx()
    ctx.scheduler = scheduler
    gen = output_oracle.reference(ctx, PROMPT, 3)
    with pytest.raises(StopIteration) as stop:
        next(gen)
    assert stop.value.value == ENTRY[:2]
    assert output_oracle.computed == {"references": 0, "from_cache": 1, "cache_rejected": 0}
    assert output_oracle.cached_reference(ctx, PROMPT) == ENTRY[:2]
    gen = output_oracle.reference_entry(ctx, PROMPT, 3)
    with pytest.raises(StopIteration) as stop:
        next(gen)
    assert stop.value.value == ENTRY, "the logprobs of the alone run come back from the disk too"
    monkeypatch.setenv(reference_cache.ENV_CACHE, "off")
    monkeypatch.setattr(output_oracle, "_references", {})
    monkeypatch.setattr(output_oracle, "_disk", {})
    assert output_oracle.cached_reference(ctx, PROMPT) is None, "the cache off: nothing read from disk"


def test_a_session_turns_history_is_neither_read_from_nor_written_to_the_disk(tmp_path, monkeypatch):
    """``reference_entry(..., disk=False)`` (a turn's history): run on this
    server even when the disk holds it, kept in memory, not written; so a
    fresh server replaying the program runs the same reference at its end."""
    scheduler = _server_with_entry_on_disk(monkeypatch, tmp_path)
    runs = []

    def run_alone(ctx, prompt, n, lora=None):
        runs.append(prompt)
        return ([7, 8, 9], 3, None)
        yield  # a generator, as the real one

    monkeypatch.setattr(output_oracle, "_run_alone", run_alone)
    monkeypatch.setattr(output_oracle, "references_key", lambda ctx, lora=None: FP)
    ctx = SimpleNamespace(scheduler=scheduler)
    history = (5, 6, 7, 8)

    def entry(prompt, disk):
        gen = output_oracle.reference_entry(ctx, prompt, 3, disk=disk)
        with pytest.raises(StopIteration) as stop:
            next(gen)
        return stop.value.value

    assert entry(PROMPT, disk=False) == ([7, 8, 9], 3, None) and runs == [PROMPT], "on disk, run anyway"
    assert entry(history, disk=False) == ([7, 8, 9], 3, None) and entry(history, disk=False) and len(runs) == 2
    assert ReferenceCache(tmp_path, output_oracle.cache_key(scheduler)).get(FP, history) is None, "not written"
    assert output_oracle.computed["from_cache"] == 0
