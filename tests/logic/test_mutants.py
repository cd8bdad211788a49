"""The built-in mutants (hooks/mutants/) without a server: the table's shape
(names, summaries, expected checks, topologies, docstrings, where each is
declared), and, in one subprocess that imports SGLang's scheduler module on
CPU, that every mutant installs on the installed release, replaces what it says (keeping
``__wrapped__``), raises PatchError on a module it was not written against,
and that the simpler ones change behaviour as their docstring says (on small
fakes and real pools). Each mutant is installed into a snapshot of the SGLang
modules that is restored afterwards, so the mutants do not see each other."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from scripted_runtime.hooks import fix_toggles, mutants, patches, sglang_compat
from scripted_runtime.hooks.patch_base import ALL_TOPOLOGIES, Patch

ROOT = Path(__file__).resolve().parents[2]

# Words the ``expected`` field is written in (mutate.caught_by's vocabulary).
CHECK_WORDS = ("contract sessions", "contract diagnostics", "contract lora", "contract priority", "invariant idle_gate", "invariant slot_ownership", "invariant radix_locks",
               "invariant pool_accounting", "invariant hicache_load_before_read", "invariant hicache_transfer_slots",
               "invariant hicache_host_accounting", "contract pause", "contract abort", "contract flush",
               "contract update_weights", "contract continue", "contract memory_occupation", "contract runtime_limits",
               "contract weight_queries", "output oracle", "end-state", "crash", "request contract", "weight-version contract", "none today",
               "unknown (written blind)")

# The mutants written blind for issue 34 (item 5), without reading the
# harness's checks: their ``expected`` is a plain-words guess, no check name.
BLIND = ("mut_merge_batch_rows_other_first", "mut_checkpoint_row_keeps_duplicate_slots",
         "mut_prefix_match_takes_whole_prompt", "mut_insert_dedup_starts_at_inserted_len",
         "mut_prefill_budget_ignores_admitted_extend", "mut_retract_keeps_kv",
         "mut_fill_ids_refresh_discards_append", "mut_stream_resends_last_token",
         "mut_chunked_prefill_answer_withheld", "mut_stop_token_checked_one_step_late")

# The second set written blind for issue 34, by another author, without reading
# the harness's checks or what its explorer draws (measured as external
# patches before anyone read them): ``expected`` is a plain-words guess too.
BLIND2 = ("mut_abort_misses_unmerged_prefill", "mut_abort_queued_no_reply",
          "mut_chunk_cached_tokens_inflated", "mut_pp_chunked_req_merged_twice",
          "mut_overlap_drops_last_token_req", "mut_stop_ids_masked_by_eos",
          "mut_flush_refused_while_paused", "mut_admission_skips_prefix_lock")


def test_at_least_twelve_mutants_with_unique_prefixed_names():
    assert len(mutants.MUTANTS) >= 12
    for key, patch in mutants.MUTANTS.items():
        assert isinstance(patch, Patch)
        assert key == patch.name
        assert patch.name.startswith("mut_") and patch.name.isidentifier(), patch.name
    installs = [p.install for p in mutants.MUTANTS.values()]
    assert len(set(installs)) == len(installs), "two mutants share an install function"


def test_each_mutant_says_what_it_breaks_and_where_it_is_seen():
    for patch in mutants.MUTANTS.values():
        assert patch.summary.strip() and "\n" not in patch.summary, patch.name
        assert patch.expected.strip(), patch.name
        assert any(word in patch.expected for word in CHECK_WORDS), (patch.name, patch.expected)
        assert patch.topologies and set(patch.topologies) <= set(ALL_TOPOLOGIES), (patch.name, patch.topologies)
        assert len(set(patch.topologies)) == len(patch.topologies), patch.name
        doc = (patch.install.__doc__ or "").strip()
        assert len(doc) > 200, f"{patch.name}: the install function's docstring is its explanation"
        assert "Plausible" in doc and "Seen by" in doc, patch.name
        assert patch.install.__name__ == f"_install_{patch.name}", patch.install.__name__


def _blind_families(names):
    """The family modules of ``names``, each checked to name no check."""
    families = {}
    for name in names:
        patch = mutants.MUTANTS[name]
        families.setdefault(patch.install.__module__.rsplit(".", 1)[1], []).append(name)
        assert patch.expected.startswith("unknown (written blind); "), (name, patch.expected)
        assert "invariant" not in patch.expected and "contract" not in patch.expected, (name, patch.expected)
        assert "oracle" not in patch.expected, (name, patch.expected)
        doc = patch.install.__doc__
        assert "Trigger:" in doc and "Seen by (written blind)" in doc, name
    return families


def test_blind_mutants_cover_the_five_families_and_name_no_check():
    families = _blind_families(BLIND)
    assert set(families) == {"kv_content", "prefix_cache", "kv_pressure", "stream_output", "requests"}
    assert list(mutants.ORDER[-len(BLIND) - len(BLIND2):-len(BLIND2)]) == list(BLIND)


def test_second_blind_set_ends_the_order_and_names_no_check():
    families = _blind_families(BLIND2)
    assert families == {"aborts": ["mut_abort_misses_unmerged_prefill", "mut_abort_queued_no_reply"],
                        "chunked_prefill": ["mut_chunk_cached_tokens_inflated", "mut_pp_chunked_req_merged_twice"],
                        "batches": ["mut_overlap_drops_last_token_req"],
                        "requests": ["mut_stop_ids_masked_by_eos"],
                        "idle_gate": ["mut_flush_refused_while_paused"],
                        "radix_locks": ["mut_admission_skips_prefix_lock"]}
    assert list(mutants.ORDER[-len(BLIND2):]) == list(BLIND2)
    assert not set(BLIND2) & set(BLIND)


def test_topology_specific_mutants_are_limited_to_their_loop():
    assert mutants.MUTANTS["mut_pp_drain_first_slot_only"].topologies == ("pp4",)
    assert mutants.MUTANTS["mut_normal_loop_ignores_pause"].topologies == ("pp1-normal",)
    assert mutants.MUTANTS["mut_overlap_skips_emptied_last_batch_result"].topologies == ("pp1-overlap",)
    assert mutants.MUTANTS["mut_pp_chunked_req_merged_twice"].topologies == ("pp4",)
    assert mutants.MUTANTS["mut_overlap_drops_last_token_req"].topologies == ("pp1-overlap",)


def test_no_clash_with_fix_toggles_and_every_name_resolves_as_a_builtin_patch():
    assert not set(mutants.MUTANTS) & set(fix_toggles.TOGGLES)
    names = set(patches.builtin_names())
    assert set(mutants.MUTANTS) <= names
    for name in mutants.MUTANTS:
        assert patches.check(name).spec == name
        assert patches.load(name) is mutants.MUTANTS[name]
        assert patches.describe(name).startswith(f"{name} (")


def test_the_mutant_the_docs_name_exists():
    docs = (ROOT / "docs" / "mutants.md").read_text()
    assert "mut_abort_keeps_row" in docs
    assert "mut_abort_keeps_row" in mutants.MUTANTS


def test_order_is_stable():
    # The kill table lists mutants in this order; it is the definition order.
    names = list(mutants.MUTANTS)
    assert names[0] == "mut_pp_drain_first_slot_only"
    assert names == [p.name for p in mutants.MUTANTS.values()]


# (name, topologies, expected) of every built-in mutant, in the kill table's
# order: written out from the table as it stood before the mutants moved next
# to their install functions (hooks/mutants/), and kept so.
PINNED = [
    ('mut_pp_drain_first_slot_only', ('pp4',), 'invariant idle_gate'),
    ('mut_normal_loop_ignores_pause', ('pp1-normal',), 'contract pause (a forward launched while paused)'),
    ('mut_pause_retract_forgets_last_batch', ('pp1-overlap', 'pp1-normal'),
     'end-state check (a request lost: held nowhere, never finished), invariant radix_locks '
     "(if it was the only request), crash (SGLang's own idle req-pool leak check)"),
    ('mut_abort_keeps_row', ('pp1-overlap', 'pp1-normal', 'pp4'),
     "crash (SGLang's own idle req-pool leak check), else end-state check (rows not all free)"),
    ('mut_abort_double_free_kv', ('pp1-overlap', 'pp1-normal', 'pp4'), 'invariant pool_accounting'),
    ('mut_checkpoint_keeps_old_lock', ('pp1-overlap', 'pp1-normal', 'pp4'),
     'invariant radix_locks (locked nodes at idle), end-state check (tokens still protected)'),
    ('mut_release_without_checkpoint_keeps_lock', ('pp1-overlap', 'pp1-normal', 'pp4'),
     'invariant radix_locks (locked nodes at idle), end-state check (tokens still protected)'),
    ('mut_chunk_alloc_ignores_held_row', ('pp1-overlap', 'pp1-normal', 'pp4'),
     'invariant slot_ownership (row moved between chunks)'),
    ('mut_prune_keeps_aborted', ('pp1-overlap', 'pp1-normal', 'pp4'),
     "contract abort (launched again after its abort finished it), crash (SGLang's own assert "
     'in release_kv_cache; pp1-normal, pp4), invariant pool_accounting (pp1-overlap)'),
    ('mut_idle_gate_ignores_last_batch', ('pp1-normal',), 'invariant idle_gate'),
    ('mut_overlap_skips_emptied_last_batch_result', ('pp1-overlap',),
     "crash (SGLang's own assert len(result_queue) == 1), else end-state check"),
    ('mut_kv_free_drops_last_index', ('pp1-overlap', 'pp1-normal', 'pp4'), 'invariant pool_accounting'),
    ('mut_update_weights_flush_skips_idle_check', ('pp1-overlap', 'pp1-normal', 'pp4'),
     'contract update_weights (a flush accepted while a live request holds KV; needs an '
     'in-place pause with a live request), invariant slot_ownership or radix_locks'),
    ('mut_admission_drops_next_waiting', ('pp1-overlap', 'pp1-normal', 'pp4'),
     "end-state check (a request lost: held nowhere, never finished), at the program's end or "
     'when a weight update would wait behind it in the tokenizer'),
    ('mut_hicache_forward_skips_load_wait', ('pp1-hicache',), 'invariant hicache_load_before_read'),
    ('mut_hicache_write_through_skips_lock', ('pp1-hicache',), 'invariant hicache_transfer_slots'),
    ('mut_hicache_host_evict_leaks', ('pp1-hicache',), 'invariant hicache_host_accounting'),
    # added after the split (issue 34's request-semantics family)
    ('mut_length_cap_one_early', ('pp1-overlap', 'pp1-normal', 'pp4'),
     'output oracle (a length finish short of its reference); request contract where the oracle compares nothing'),
    # issue 35: the RL weight-sync cycle's memory steps
    ('mut_release_keeps_cache_while_paused', ('pp1-overlap', 'pp1-normal', 'pp4'),
     'contract memory_occupation (the tree still holds tokens right after the release), output oracle (a prefix '
     'hit reads KV the release lost)'),
    ('mut_resume_skips_static_state', ('pp1-overlap', 'pp1-normal', 'pp4'),
     'contract memory_occupation (the buffers differ from the release\'s after the resume), output oracle (the '
     'rotary cache stays what the release left)'),
    ('mut_micro_batch_limit_read_once', ('pp1-overlap', 'pp1-normal', 'pp4'),
     'contract runtime_limits (a prefill past the limit set_internal_state lowered)'),
    ('mut_weight_checksum_cached', ('pp1-overlap', 'pp1-normal', 'pp4'),
     'contract weight_queries (the same checksum for different weights, after a weight update)'),
    ('mut_tensor_update_skips_flush', ('pp1-overlap', 'pp1-normal', 'pp4'),
     'contract update_weights (the tree still holds tokens right after an accepted update with flush), output '
     'oracle (a prefix hit reads KV computed under the old weights)'),
    ('mut_session_close_always_deferred', ('pp1-overlap', 'pp1-normal', 'pp4'),
     'contract sessions (a closed idle session is still open right after the close)'),
    ('mut_profile_num_steps_ignored', ('pp1-overlap', 'pp1-normal', 'pp4'),
     'contract diagnostics (a profile started with num_steps still runs past its target)'),
    ('mut_weight_version_event_names_new_version', ('pp1-overlap', 'pp1-normal', 'pp4'),
     'weight-version contract (an answer labels tokens made before a version change with the new version)'),
    ('mut_lora_admission_forgets_running', ('pp1-lora',),
     'crash (fetch_new_loras asserts more adapters than slots), contract lora (a forward holds more adapters than '
     'max_loras_per_batch)'),
    ('mut_lora_slot_keeps_stale_weights', ('pp1-lora',),
     'output oracle (a request served with an adapter outputs another adapter\'s tokens)'),
    # issue 35: the trainer's broadcast
    ('mut_distributed_update_loads_into_no_runner', ('pp1-overlap', 'pp1-normal', 'pp4'),
     "contract update_weights (an accepted broadcast update leaves weights other than its checkpoint's)"),
    # grammar 11: the LoRA load from tensors
    ('mut_lora_tensor_load_unnormalized', ('pp1-lora',),
     'output oracle (a request served with an adapter loaded from tensors outputs what its files do not), crash'),
    # priority scheduling (written with the priority contract, before the explorer drew a priority)
    ('mut_priority_preemption_threshold_dropped', ('pp1-priority',),
     'contract priority (a request preempted by none better by more than the threshold)'),
    # written blind (issue 34, item 5)
    ('mut_merge_batch_rows_other_first', ('pp1-overlap', 'pp1-normal', 'pp4'),
     "unknown (written blind); should show as wrong outputs (requests decode in each other's rows), then a "
     'crash or leak once one of them finishes'),
    ('mut_checkpoint_row_keeps_duplicate_slots', ('pp1-overlap', 'pp1-normal', 'pp4'),
     'unknown (written blind); should show as wrong outputs (a request reads KV slots that were freed and '
     'handed to another request)'),
    ('mut_prefix_match_takes_whole_prompt', ('pp1-overlap', 'pp1-normal', 'pp4'),
     'unknown (written blind); should show as a wrong first token or a crash for a prompt that is fully '
     'cached (nothing left to extend)'),
    ('mut_insert_dedup_starts_at_inserted_len', ('pp1-overlap', 'pp1-normal', 'pp4'),
     'unknown (written blind); should show as a leak-check crash (KV both free and in the tree), then wrong '
     'outputs for later prefix hits'),
    ('mut_prefill_budget_ignores_admitted_extend', ('pp1-overlap', 'pp1-normal', 'pp4'),
     "unknown (written blind); should show as a crash (SGLang's own 'Prefill out of memory') under KV pressure"),
    ('mut_retract_keeps_kv', ('pp1-overlap', 'pp1-normal', 'pp4'),
     "unknown (written blind); should show as a KV leak (SGLang's own idle leak check crashes, or the pool "
     'never drains)'),
    ('mut_fill_ids_refresh_discards_append', ('pp1-overlap', 'pp1-normal', 'pp4'),
     'unknown (written blind); should show as wrong outputs after a retraction (the request restarts from its '
     'prompt, keeping the tokens it already has)'),
    ('mut_stream_resends_last_token', ('pp1-overlap', 'pp1-normal', 'pp4'),
     'unknown (written blind); should show as wrong outputs (a token repeated at every partial output: '
     'streamed requests, or non-streamed ones past 50 tokens)'),
    ('mut_chunked_prefill_answer_withheld', ('pp1-overlap', 'pp1-normal', 'pp4'),
     'unknown (written blind); should show as a request that never gets an answer (a chunked prompt with '
     'max_new_tokens=1)'),
    ('mut_stop_token_checked_one_step_late', ('pp1-overlap', 'pp1-normal', 'pp4'),
     'unknown (written blind); should show as wrong outputs (one token after the stop token; a first-token '
     'stop ignored)'),
    # written blind, second set (issue 34)
    ('mut_abort_misses_unmerged_prefill', ('pp1-overlap', 'pp1-normal', 'pp4'),
     'unknown (written blind); should show as an abort that is lost (a request aborted right after its '
     'prefill decodes on and answers normally instead of as aborted)'),
    ('mut_abort_queued_no_reply', ('pp1-overlap', 'pp1-normal', 'pp4'),
     'unknown (written blind); should show as a request that never gets an answer (aborted while still '
     'queued: the client hangs, a pause(abort) or weight update behind it never completes)'),
    ('mut_chunk_cached_tokens_inflated', ('pp1-overlap', 'pp1-normal', 'pp4'),
     "unknown (written blind); should show as a wrong cached_tokens in a chunked prompt's answer (its own "
     'earlier chunks counted as prefix-cache hits); the tokens are right'),
    ('mut_pp_chunked_req_merged_twice', ('pp4',),
     'unknown (written blind); should show as wrong outputs for a chunked prompt at pp4 (it decodes in two '
     'micro-batches), likely a crash or a KV accounting failure once it finishes'),
    ('mut_overlap_drops_last_token_req', ('pp1-overlap',),
     'unknown (written blind); should show as a request that never finishes (stopped one token short of '
     'max_new_tokens, no answer) and a KV and row leak once the engine is otherwise idle'),
    ('mut_stop_ids_masked_by_eos', ('pp1-overlap', 'pp1-normal', 'pp4'),
     'unknown (written blind); should show as wrong outputs (a request runs on past its stop token to '
     'max_new_tokens or EOS, finish reason length instead of the matched stop token)'),
    ('mut_flush_refused_while_paused', ('pp1-overlap', 'pp1-normal', 'pp4'),
     "unknown (written blind); should show as a refused flush (flush_cache, or update_weights' flush, answers "
     'failure after a pause with queued requests) and the old prefix cache still hit after it'),
    ('mut_admission_skips_prefix_lock', ('pp1-overlap', 'pp1-normal', 'pp4'),
     'unknown (written blind); should show as wrong outputs for a prefix hit under KV pressure (its prefix '
     'KV evicted and reused), then a KV accounting crash or a double free'),
]


def test_the_table_is_pinned_name_topologies_expected_and_order():
    assert [(p.name, p.topologies, p.expected) for p in mutants.MUTANTS.values()] == PINNED
    assert list(mutants.ORDER) == [name for name, _, _ in PINNED]


def test_each_mutant_is_declared_in_a_family_module_by_its_install_function():
    families = {"idle_gate", "loops", "pools", "radix_locks", "batches", "hicache", "requests",
                "kv_content", "prefix_cache", "kv_pressure", "stream_output", "aborts", "chunked_prefill",
                "memory_occupation", "runtime_ops", "lora", "priority"}
    for patch in mutants.MUTANTS.values():
        module = patch.install.__module__
        assert module.startswith("scripted_runtime.hooks.mutants."), (patch.name, module)
        assert module.rsplit(".", 1)[1] in families, (patch.name, module)
    # the decorator hands the function back unchanged: its module holds it under its own name
    import importlib
    for patch in mutants.MUTANTS.values():
        assert getattr(importlib.import_module(patch.install.__module__), patch.install.__name__) is patch.install


def test_a_name_declared_twice_or_an_order_that_misses_one_is_refused():
    from scripted_runtime.hooks.mutants import base
    from scripted_runtime.hooks.patch_base import PatchError, declaring

    table = {}
    declare = declaring(table, lambda install: Patch("mut_x", "x", install))

    def install(module):
        return None

    assert declare(install) is install and table["mut_x"].install is install
    with pytest.raises(PatchError, match="'mut_x' is declared twice"):
        declare(install)
    with pytest.raises(PatchError, match="the mutant order names"):
        base.in_order(mutants.ORDER[:-1])
    with pytest.raises(PatchError, match="the mutant order names"):
        base.in_order((*mutants.ORDER, mutants.ORDER[0]))
    with pytest.raises(PatchError, match="declared twice"):
        base.mutant("mut_abort_keeps_row", topologies=base.ALL, summary="s", expected="crash")(install)


def test_fix_toggles_are_declared_by_their_revert_functions():
    assert [(t.name, t.fixed_in, t.install.__name__) for t in fix_toggles.TOGGLES.values()] == [
        ("pr27446", "0.5.13", "_revert_pr27446"),
        ("pr17850", "0.5.9", "_revert_pr17850"),
        ("issue14062", "0.5.22", "_revert_issue14062"),
    ]
    for toggle in fix_toggles.TOGGLES.values():
        assert toggle.summary.strip() and "\n" not in toggle.summary, toggle.name
        assert getattr(fix_toggles, toggle.install.__name__) is toggle.install


# --- installed on the real scheduler module (one subprocess) --------------------

CHILD_REPORT = pytest.StashKey()  # (Popen, directory) of the child conftest.py started at collection
CHILD = r'''
import importlib, inspect, json, sys, types, warnings
from collections import deque
from types import SimpleNamespace
warnings.simplefilter("ignore")

import os
_ENV_BEFORE = dict(os.environ)
from scripted_runtime.hooks import cpu_enablement
cpu_enablement.install()
import sglang.srt.managers.scheduler as sched
IMPORT_ENV = sorted(k for k, v in os.environ.items() if _ENV_BEFORE.get(k) != v)
from scripted_runtime.hooks import mutants
from scripted_runtime.hooks.patch_base import PatchError
for name in mutants.PATCHED_MODULES:
    importlib.import_module(name)

MISSING = object()
report = {"install": {}, "fake_module": {}, "fake_scheduler": {}, "behaviour": {}, "restored": True,
          "import_env": IMPORT_ENV}


def _take():
    out = {}
    for mn, mod in list(sys.modules.items()):
        if mod is None or not mn.startswith("sglang"):
            continue
        out[("mod", mn)] = (mod, dict(vars(mod)))
        for v in list(vars(mod).values()):
            if isinstance(v, type) and v.__module__ == mn:
                out[("cls", mn, v.__qualname__)] = (v, dict(vars(v)))
    return out


_BASE = {"snap": None, "modules": 0}


def snapshot():
    """Module dicts and class dicts of every loaded SGLang module. Taking one
    is most of this child's time (thousands of class dicts), so the last one
    is handed out again while nothing differs from it and no module was
    imported since (a restore puts every value back)."""
    base = _BASE["snap"]
    if base is None or len(sys.modules) != _BASE["modules"] or changes(base):
        _BASE["snap"], _BASE["modules"] = _take(), len(sys.modules)
    return _BASE["snap"]


def changes(before):
    """(key, owner, attr, old, new) for every attribute of a module or class
    in ``before`` whose value is no longer the one it held."""
    found = []
    for key, (owner, old) in before.items():
        now = vars(owner)
        for attr, value in now.items():
            if old.get(attr, MISSING) is not value:
                found.append((key, owner, attr, old.get(attr, MISSING), value))
    return found


def restore(before):
    for key, owner, attr, old, new in changes(before):
        if old is MISSING:
            delattr(owner, attr)
        else:
            setattr(owner, attr, old)
    return not changes(before)


def installed(name, fn):
    """Install mutant ``name``, run ``fn(changed)``, restore; the error text or None."""
    before = snapshot()
    try:
        mutants.MUTANTS[name].install(sched)
        fn(changes(before))
        return None
    except Exception as exc:  # noqa: BLE001
        import traceback
        return f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-1500:]}"
    finally:
        report["restored"] &= restore(before)


# 1. every mutant installs and replaces callables that keep __wrapped__
for name in mutants.MUTANTS:
    def check(changed, name=name):
        rows = []
        for key, owner, attr, old, new in changed:
            if attr.startswith("__"):
                continue
            rows.append({"where": ".".join(key[1:]), "attr": attr,
                         "wrapped_is_previous": getattr(new, "__wrapped__", MISSING) is old,
                         "callable": callable(new)})
        report["install"][name] = rows
    err = installed(name, check)
    if err:
        report["install"][name] = err

# 2. a module that is not the 0.5.23 scheduler module: PatchError, nothing else
for label, fake in (("fake_module", types.ModuleType("not_the_scheduler")),
                    ("fake_scheduler", SimpleNamespace(Scheduler=type("Scheduler", (), {})))):
    for name, patch in mutants.MUTANTS.items():
        before = snapshot()
        try:
            patch.install(fake)
            report[label][name] = "installed"
        except PatchError as exc:
            report[label][name] = "PatchError: " + str(exc)
        except Exception as exc:  # noqa: BLE001
            report[label][name] = f"OTHER {type(exc).__name__}: {exc}"
        finally:
            report["restored"] &= restore(before)

# 3. a copied loop whose source differs is refused
before = snapshot()
try:
    def event_loop_normal(self):
        return None
    sched.Scheduler.event_loop_normal = event_loop_normal
    try:
        mutants.MUTANTS["mut_normal_loop_ignores_pause"].install(sched)
        report["digest_guard"] = "installed"
    except PatchError as exc:
        report["digest_guard"] = str(exc)
finally:
    report["restored"] &= restore(before)

# 4. a replaced event loop keeps the harness's crash reporting (the hook wraps the loops first)
from scripted_runtime.hooks import scheduler_hook

report["crash_reporting"] = {}
for name, loop in (("mut_normal_loop_ignores_pause", "event_loop_normal"),
                   ("mut_overlap_skips_emptied_last_batch_result", "event_loop_overlap")):
    before = snapshot()
    try:
        scheduler_hook.install(sched)
        hooked = getattr(sched.Scheduler, loop)
        mutants.MUTANTS[name].install(sched)
        now = getattr(sched.Scheduler, loop)
        report["crash_reporting"][name] = {
            "reports_crashes": now.__code__ is scheduler_hook.report_crashes(lambda self: None).__code__,
            "wrapped_is_hooked_original": now.__wrapped__ is hooked,
        }
    finally:
        report["restored"] &= restore(before)

# 5. behaviour on small fakes and real pools
B = report["behaviour"]


class FakeBatch:
    def __init__(self, reqs=()):
        self.reqs = list(reqs)

    def is_empty(self):
        return not self.reqs

    def copy(self):
        return FakeBatch(self.reqs)


def behaviour(name, fn):
    out = {}
    err = installed(name, lambda changed: fn(out))
    B[name] = err or out


def pp_drain(out):
    drained = sched.Scheduler._pp_microbatches_drained
    busy = SimpleNamespace(running_mbs=[FakeBatch(), FakeBatch(), FakeBatch()],
                           mbs=[None, FakeBatch(["r"]), None])
    out["slot1_busy_says_drained"] = drained(busy)
    out["slot0_busy_says_drained"] = drained(SimpleNamespace(running_mbs=[FakeBatch(["r"])] + [FakeBatch()] * 2,
                                                             mbs=[None] * 3))


saved_get_parallel = sched.get_parallel
sched.get_parallel = lambda: SimpleNamespace(pp_size=4)
try:
    behaviour("mut_pp_drain_first_slot_only", pp_drain)
finally:
    sched.get_parallel = saved_get_parallel


class FakeLoopScheduler:
    """Runs one paused iteration of event_loop_normal, then exits."""

    def __init__(self):
        self.gracefully_exit = False
        self._engine_paused = True
        self.running_batch = FakeBatch()
        self.last_batch = None
        self.calls = []

    def ingest_requests(self):
        self.calls.append("ingest")

    def _record_scheduler_state_for_paused_engine(self):
        self.calls.append("paused")
        self.gracefully_exit = True

    def get_next_batch_to_run(self, running_batch, last_batch):
        self.calls.append("schedule")
        return SimpleNamespace(running_batch=running_batch, batch_to_run=None)

    def on_idle(self):
        self.calls.append("idle")
        self.gracefully_exit = True


def normal_loop(out):
    fake = FakeLoopScheduler()
    sched.Scheduler.event_loop_normal(fake)
    out["calls"] = fake.calls


plain = FakeLoopScheduler()
sched.Scheduler.event_loop_normal(plain)
B["event_loop_normal unmutated"] = {"calls": plain.calls}
behaviour("mut_normal_loop_ignores_pause", normal_loop)


class FakeOverlapScheduler:
    """Two launches: the first chunk batch is emptied by the filter before
    the second launch (get_next_batch_to_run), as a chunked prefill does."""

    def __init__(self):
        self.gracefully_exit = False
        self._engine_paused = False
        self.running_batch = FakeBatch()
        self.last_batch = None
        self.is_generation = True
        self.enable_unified_memory = False
        self.processed = []
        self.iteration = 0
        self.b1 = FakeBatch(["chunked"])
        self.chunked_req = "chunked"  # the prefill goes on: more chunks to come

    def ingest_requests(self):
        self.iteration += 1

    def get_next_batch_to_run(self, running_batch, last_batch):
        if self.iteration == 1:
            return SimpleNamespace(running_batch=running_batch, batch_to_run=self.b1)
        self.b1.reqs = []  # filter_batch(reqs_to_exclude=[chunked_req]) in place
        return SimpleNamespace(running_batch=running_batch, batch_to_run=FakeBatch(["chunked"]))

    def is_disable_overlap_for_batch(self, batch, last_batch):
        return False

    def run_batch(self, batch):
        return ("result", self.iteration)

    def _apply_war_barrier(self):
        pass

    def process_batch_result(self, batch, result):
        self.processed.append(result)

    def launch_batch_sample_if_needed(self, result, batch):
        if self.iteration == 2:
            self.gracefully_exit = True

    def on_idle(self):
        pass


def overlap_loop(out):
    fake = FakeOverlapScheduler()
    sched.Scheduler.event_loop_overlap(fake)
    out["queued"] = len(fake.result_queue)
    out["processed"] = [list(r) for r in fake.processed]


plain = FakeOverlapScheduler()
sched.Scheduler.event_loop_overlap(plain)
B["event_loop_overlap unmutated"] = {"queued": len(plain.result_queue),
                                     "processed": [list(r) for r in plain.processed]}
behaviour("mut_overlap_skips_emptied_last_batch_result", overlap_loop)

import torch
from sglang.srt.managers.schedule_batch import FINISH_ABORT, FINISH_LENGTH, ScheduleBatch
from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool


class FakeKv:
    def __init__(self, row=None, allocated=0):
        self.req_pool_idx = row
        self.kv_allocated_len = allocated

    @property
    def holds_kv(self):
        return self.req_pool_idx is not None


class FakeReq:
    def __init__(self, rid, reason=None, row=None, allocated=0):
        self.rid = rid
        self.finished_reason = reason
        self.kv = FakeKv(row, allocated)
        self.session = None

    def finished(self):
        return self.finished_reason is not None


def row_pool():
    return ReqToTokenPool(size=8, max_context_len=16, device="cpu", enable_memory_saver=False)


def abort_keeps_row(out):
    pool = row_pool()
    aborted, done = FakeReq("a", FINISH_ABORT()), FakeReq("b", FINISH_LENGTH(length=1))
    aborted.kv.req_pool_idx, done.kv.req_pool_idx = pool.alloc_rows(2)
    free_before = pool.available_size()
    pool.free(aborted)
    out["aborted_row_back"] = pool.available_size() - free_before
    out["aborted_row_forgotten"] = aborted.kv.req_pool_idx is None
    pool.free(done)
    out["finished_row_back"] = pool.available_size() - free_before


behaviour("mut_abort_keeps_row", abort_keeps_row)


def chunk_alloc(out):
    pool = row_pool()
    chunked = FakeReq("c", row=pool.alloc_rows(1)[0], allocated=64)
    first = chunked.kv.req_pool_idx
    free_before = pool.available_size()
    rows = pool.alloc([chunked, FakeReq("new")])
    out["moved"] = rows[0] != first
    out["old_row_free"] = first in pool.free_slots
    out["rows_taken"] = free_before - pool.available_size()  # unmutated: 1 (the new request's)


behaviour("mut_chunk_alloc_ignores_held_row", chunk_alloc)


def kv_free(out):
    alloc = TokenToKVPoolAllocator(16, torch.float32, "cpu", None, False)
    got = alloc.alloc(8)
    out["start"] = alloc.available_size()
    alloc.free(got[:1])
    out["after_single"] = alloc.available_size()
    alloc.free(got[1:4])
    out["after_three"] = alloc.available_size()
    alloc.free_group_begin()
    alloc.free(got[4:6])
    alloc.free(got[6:8])
    alloc.free_group_end()
    out["after_group_of_four"] = alloc.available_size()


behaviour("mut_kv_free_drops_last_index", kv_free)


def prune(out):
    batch = ScheduleBatch(reqs=[FakeReq("aborted", FINISH_ABORT()), FakeReq("running")], batch_is_full=False)
    batch.filter_batch()
    out["kept"] = [r.rid for r in batch.reqs]


behaviour("mut_prune_keeps_aborted", prune)

from sglang.srt.disaggregation.utils import DisaggregationMode


def idle_fake():
    return SimpleNamespace(
        running_batch=FakeBatch(), chunked_req=None, dllm_manager=SimpleNamespace(any_staging_reqs=lambda: False),
        last_batch=FakeBatch(["just-prefilled"]), enable_overlap=False, result_queue=deque(),
        _pp_microbatches_drained=lambda: True, waiting_queue=[], _engine_paused=False,
        disaggregation_mode=DisaggregationMode.NULL, grammar_manager=SimpleNamespace(grammar_queue=[]),
        enable_hisparse=False, enable_hierarchical_cache=False, enable_lmcache=False)


def idle_gate(out):
    fake = idle_fake()
    out["idle_with_last_batch"] = sched.Scheduler.is_fully_idle(fake)
    out["last_batch_kept"] = fake.last_batch.reqs == ["just-prefilled"]


B["is_fully_idle unmutated"] = {"idle_with_last_batch": sched.Scheduler.is_fully_idle(idle_fake())}
behaviour("mut_idle_gate_ignores_last_batch", idle_gate)

from sglang.srt.managers.scheduler_components.weight_updater import SchedulerWeightUpdaterManager


class BusyScheduler:
    def __init__(self):
        self.flushed = 0

    def is_fully_idle(self, for_health_check=False, ignore_waiting=False):
        return False

    def flush_cache(self, empty_cache=True):
        if self.is_fully_idle(ignore_waiting=False):
            self.flushed += 1
            return True
        return False


def update_flush(out):
    busy = BusyScheduler()
    mgr = SimpleNamespace(scheduler=busy, flush_cache=busy.flush_cache)
    req = SimpleNamespace(flush_cache=True, torch_empty_cache=False)
    out["answer"] = list(SchedulerWeightUpdaterManager.flush_cache_after_weight_update(mgr, req, True, "ok"))
    out["flushed"] = busy.flushed
    out["gate_restored"] = "is_fully_idle" not in vars(busy) and busy.is_fully_idle() is False


busy = BusyScheduler()
B["flush_cache_after_weight_update unmutated"] = {"answer": list(
    SchedulerWeightUpdaterManager.flush_cache_after_weight_update(
        SimpleNamespace(scheduler=busy, flush_cache=busy.flush_cache),
        SimpleNamespace(flush_cache=True, torch_empty_cache=False), True, "ok"))[:1], "flushed": busy.flushed}
behaviour("mut_update_weights_flush_skips_idle_check", update_flush)

# --- the mutants written blind (issue 34, item 5): each once unmutated, once mutated ---
from array import array

from sglang.srt.managers.schedule_batch import Req
from sglang.srt.managers.scheduler_components.output_streamer import (SchedulerOutputStreamer,
                                                                      _GenerationStreamAccumulator)
from sglang.srt.mem_cache.base_prefix_cache import InsertParams
from sglang.srt.mem_cache.prefill_budget import PrefillBudget
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

schedule_batch = sys.modules["sglang.srt.managers.schedule_batch"]


def both(name, fn):
    """``fn`` on the unmutated release, then with ``name`` installed."""
    plain = {}
    fn(plain)
    B[name + " unmutated"] = plain
    behaviour(name, fn)


def row_batch(reqs, rows, lens):
    batch = ScheduleBatch(reqs=list(reqs), batch_is_full=False)
    batch.req_pool_indices = torch.tensor(rows, dtype=torch.int64)
    batch.req_pool_indices_cpu = torch.tensor(rows, dtype=torch.int64)
    batch.seq_lens = torch.tensor(lens, dtype=torch.int64)
    batch.seq_lens_cpu = torch.tensor(lens, dtype=torch.int64)
    batch.orig_seq_lens = torch.tensor(lens, dtype=torch.int32)
    batch.input_ids = torch.tensor([100 + r for r in rows], dtype=torch.int64)
    batch.sampling_info = SimpleNamespace(merge_batch=lambda other: None)
    batch.model_config = SimpleNamespace(is_encoder_decoder=False)
    return batch


def merge_rows(out):
    running = row_batch(["a", "b"], [3, 4], [10, 11])
    running.merge_batch(row_batch(["c"], [7], [20]))
    out["reqs"] = running.reqs
    out["rows"] = running.req_pool_indices.tolist()
    out["rows_cpu"] = running.req_pool_indices_cpu.tolist()
    out["seq_lens"] = running.seq_lens.tolist()
    out["input_ids"] = running.input_ids.tolist()
    empty = row_batch([], [], [])
    empty.merge_batch(row_batch(["c"], [7], [20]))
    out["into_empty_rows"] = empty.req_pool_indices.tolist()


both("mut_merge_batch_rows_other_first", merge_rows)


class BlindKv:
    def __init__(self, row=None, protected=0):
        self.req_pool_idx = row
        self.cache_protected_len = protected

    @property
    def holds_kv(self):
        return self.req_pool_idx is not None


def checkpoint_rebind(out):
    pool = row_pool()
    row = pool.alloc_rows(1)[0]
    pool.req_to_token[row, :6] = torch.tensor([11, 12, 13, 14, 15, 16], dtype=pool.req_to_token.dtype)
    req = SimpleNamespace(kv=BlindKv(row))

    def checkpoint_into_tree(req, *, up_to, **kwargs):
        # the tree already held positions 0..4 (another request's slots 1..4): the row is rebound to them
        pool.write((req.kv.req_pool_idx, slice(0, 4)), torch.tensor([1, 2, 3, 4], dtype=torch.int32))
        req.kv.cache_protected_len = 4

    cache = SimpleNamespace(session=SimpleNamespace(try_checkpoint=lambda req, up_to, **kwargs: False),
                            checkpoint_into_tree=checkpoint_into_tree, req_to_token_pool=pool)
    UnifiedRadixCache.checkpoint(cache, req, up_to=6)
    out["row"] = pool.req_to_token[row, :6].tolist()
    out["protected"] = req.kv.cache_protected_len


both("mut_checkpoint_row_keeps_duplicate_slots", checkpoint_rebind)


def max_prefix(out):
    fake = SimpleNamespace(dllm_config=None, return_logprob=False, logprob_start_len=-1, is_dllm=lambda: False)
    out["of_10"] = Req._compute_max_prefix_len(fake, 10)
    fake.return_logprob, fake.logprob_start_len = True, 3
    out["of_10_logprob_from_3"] = Req._compute_max_prefix_len(fake, 10)


both("mut_prefix_match_takes_whole_prompt", max_prefix)


def insert_dedup(out):
    seen = []

    def begin_insert(params):
        seen.append(params.prev_prefix_len)
        return SimpleNamespace(actions=[], result=SimpleNamespace(cache_actions=[]))

    core = SimpleNamespace(has_ongoing_insert=lambda: False, begin_insert=begin_insert, end_insert=lambda: [])
    cache = SimpleNamespace(disable=False, buffer_pipeline=None, insert_session_id=None, tree_core=core,
                            _apply_cache_actions=lambda actions: None)
    matched = InsertParams(prev_prefix_len=5, inserted_len=0)  # a 5-token prefix hit, first checkpoint
    UnifiedRadixCache.insert(cache, matched)
    UnifiedRadixCache.insert(cache, InsertParams(prev_prefix_len=5, inserted_len=5))  # its own earlier insert
    out["prev_prefix_lens_seen"] = seen
    out["caller_params_unchanged"] = matched.prev_prefix_len == 5


both("mut_insert_dedup_starts_at_inserted_len", insert_dedup)


def budget_reserve(out):
    budget = PrefillBudget(SimpleNamespace(page_size=1), None)
    budget.reserve(10, 4, extra_tokens=2)  # extend 10, decode headroom 4, 2 extra slots
    out["total_offset"], out["current_offset"] = budget.total_offset, budget.current_offset


both("mut_prefill_budget_ignores_admitted_extend", budget_reserve)


def retract_release(out):
    calls = []
    saved = schedule_batch.release_kv_cache, schedule_batch.evict_from_tree_cache, schedule_batch.get_disagg
    schedule_batch.release_kv_cache = lambda req, tree_cache, *, checkpoint: calls.append(
        ["release", req.kv.cache_protected_len, checkpoint])
    schedule_batch.evict_from_tree_cache = lambda tree_cache, num_tokens: None
    schedule_batch.get_disagg = lambda: SimpleNamespace(disaggregation_mode="null")
    try:
        req = SimpleNamespace(kv=BlindKv(row=1, protected=4), finished=lambda: False, owned_kv_len=lambda: 9,
                              reset_for_retract=lambda: calls.append(["reset"]))
        schedule_batch.release_req(req=req, remaing_req_count=1, req_to_token_pool=None,
                                   token_to_kv_pool_allocator=None, tree_cache=None, hisparse_coordinator=None,
                                   offload_kv=False)
    finally:
        schedule_batch.release_kv_cache, schedule_batch.evict_from_tree_cache, schedule_batch.get_disagg = saved
    out["calls"] = calls  # release frees [cache_protected_len, owned=9)


both("mut_retract_keeps_kv", retract_release)


def fill_ids(out):
    fake = SimpleNamespace(origin_input_ids=array("q", [1, 2, 3]), output_ids=array("q", [7, 8]),
                           full_untruncated_fill_ids=array("q"))
    Req.refresh_fill_ids(fake)  # a fresh request: the full rebuild
    out["first_admission"] = list(fake.full_untruncated_fill_ids)
    fake.output_ids.append(9)
    Req.refresh_fill_ids(fake)  # a resume (or a finish): the in-place append
    out["after_one_more_token"] = list(fake.full_untruncated_fill_ids)


both("mut_fill_ids_refresh_discards_append", fill_ids)


class StreamReq:
    """The fields the stream accumulator reads (Rust-server mode skips the detokenizer's)."""

    def __init__(self, rid, output=(), finished=False, extend_batch_idx=1, decode_batch_idx=1):
        self.rid = rid
        self.output_ids = array("q", output)
        self.finished_reason = SimpleNamespace(to_json=lambda: {"type": "length"}) if finished else None
        self.finished_len, self.finished_output = None, False
        self.send_token_offset = self.send_output_token_logprobs_offset = 0
        self.stream, self.sampling_params, self.beam_group = True, SimpleNamespace(stream_interval=None), None
        self.origin_input_ids, self.reasoning_tokens, self.cached_tokens = array("q", [1, 2]), 0, 0
        self.retraction_count, self.time_stats, self.customized_info, self.weight_version_events = 0, None, None, []
        self.extend_batch_idx, self.decode_batch_idx = extend_batch_idx, decode_batch_idx

    @property
    def output_ids_through_stop(self):
        return self.output_ids

    def finished(self):
        return self.finished_reason is not None

    def check_match_stop_str_prefix(self):
        return False

    def get_mm_token_counts(self):
        return 0, 0, 0


def stream_accumulator():
    return _GenerationStreamAccumulator(
        return_logprob=False, return_hidden_states=False, return_routed_experts=False, return_indexer_topk=False,
        spec_algorithm=SimpleNamespace(is_none=lambda: True), disaggregation_mode=None, default_stream_interval=1,
        default_force_stream_interval=50, get_cached_tokens_details=lambda req: None,
        is_request_level_customized_info_key=lambda key: False, current_weight_version=None, rust_server_mode=True)


def stream_offsets(out):
    req, received = StreamReq("streamed", [4]), []
    for next_token in (5, 6, None):  # three steps of a streamed request; the last one finishes it
        if next_token is None:
            req.finished_reason = SimpleNamespace(to_json=lambda: {"type": "length"})
        acc = stream_accumulator()
        acc.accept(req=req)
        received.extend(acc.output_ids[-1])
        if next_token is not None:
            req.output_ids.append(next_token)
    out["received"] = received


both("mut_stream_resends_last_token", stream_offsets)


def stream_skips(out):
    streamed = []
    fake = SimpleNamespace(is_generation=True, _stream_output_generation=lambda reqs, return_logprob, skip_req:
                           streamed.append([[r.rid for r in reqs], skip_req.rid]))
    reqs = [StreamReq("last_chunk_finished", [4], finished=True, extend_batch_idx=2, decode_batch_idx=0),
            StreamReq("one_chunk", [4], extend_batch_idx=1, decode_batch_idx=0),
            StreamReq("decoding", [4, 5], extend_batch_idx=3, decode_batch_idx=1),
            StreamReq("middle_chunk", extend_batch_idx=1, decode_batch_idx=0)]
    SchedulerOutputStreamer.stream_output(fake, reqs, False, reqs[-1])
    out["streamed"] = streamed


both("mut_chunked_prefill_answer_withheld", stream_skips)


def stop_check(out):
    def req(output):
        return SimpleNamespace(sampling_params=SimpleNamespace(ignore_eos=False, stop_token_ids={5}),
                               eos_token_ids=None, tokenizer=None, output_ids=array("q", output),
                               finished_reason=None, finished_len=None)

    def check(fake):
        return [Req._check_token_based_finish(fake, fake.output_ids[-1:]), fake.finished_len]

    out["stop_first"] = check(req([5]))
    out["stop_second"] = check(req([3, 5]))
    out["one_after_stop"] = check(req([3, 5, 9]))
    out["two_after_stop"] = check(req([3, 5, 9, 9]))


both("mut_stop_token_checked_one_step_late", stop_check)

# --- the mutants written blind, second set (issue 34): each once unmutated, once mutated ---
from sglang.srt.managers.schedule_policy import PrefillAdder

pp = {"size": 1}
saved_get_parallel = sched.get_parallel
sched.get_parallel = lambda: SimpleNamespace(pp_size=pp["size"])


def inflight(out):
    fake = SimpleNamespace(running_batch="running", last_batch="last_prefill", running_mbs=["running0", "running1"],
                           mbs=["mb0", "mb1"], enable_continuous_input_polling=False, result_queue=deque())
    for size in (1, 4):
        pp["size"] = size
        out[f"pp{size}"] = sched.Scheduler._collect_inflight_batches(fake)
    pp["size"] = 1
    fake.enable_continuous_input_polling, fake.result_queue = True, deque([("queued", None)])
    out["pp1_polling"] = sched.Scheduler._collect_inflight_batches(fake)


try:
    both("mut_abort_misses_unmerged_prefill", inflight)
finally:
    sched.get_parallel = saved_get_parallel


class AbortScheduler:
    """What abort_request reads on a non-disaggregated, non-dLLM scheduler
    with two queued requests and nothing running."""

    def __init__(self):
        self.chunked_req = self.mm_receiver = self.dllm_config = None
        self.disaggregation_mode = DisaggregationMode.NULL
        self.waiting_queue = [SimpleNamespace(rid=rid, kv=SimpleNamespace(holds_mamba=False))
                              for rid in ("queued", "other")]
        self.beam_coordinator = SimpleNamespace(retire_group=lambda req: None)
        self.grammar_manager = SimpleNamespace(abort_requests=lambda recv_req: None)
        self.released, self.answered = [], []

    def _release_aborted_request(self, req):
        self.released.append(req.rid)

    def send_abort_output(self, abort_req, req):
        self.answered.append(abort_req.rid)

    def collect_inflight_reqs(self):
        return set()


def queued_abort(out):
    saved = sched._make_abort_req
    sched._make_abort_req = lambda req, finished_reason=None: SimpleNamespace(rid=req.rid)
    try:
        fake = AbortScheduler()
        sched.Scheduler.abort_request(fake, SimpleNamespace(rid="queued", abort_all=False, finished_reason=None,
                                                            abort_message=None))
    finally:
        sched._make_abort_req = saved
    out["queue"] = [r.rid for r in fake.waiting_queue]
    out["released"], out["answered"] = fake.released, fake.answered
    out["send_restored"] = "send_abort_output" not in vars(fake)


both("mut_abort_queued_no_reply", queued_abort)


class ChunkReq:
    """What prepare_for_extend reads of a plain text request."""

    def __init__(self, prompt, prefix_len, extend_end):
        self.origin_input_ids = array("q", range(1, prompt + 1))
        self.full_untruncated_fill_ids = self.origin_input_ids
        self.prefix_len, self.extend_end, self.logprob_start_len = prefix_len, extend_end, -1
        self.input_embeds = self.positional_embed_overrides = self.multimodal_inputs = None
        self.extend_batch_idx, self.retracted_stain, self.is_retracted = 0, False, False
        self.already_computed, self.cached_tokens, self._cache_breakdown_computed = 0, 0, True
        self.kv = SimpleNamespace(holds_mamba=False)

    @property
    def extend_len(self):
        return self.extend_end - self.prefix_len

    def get_fill_ids(self):
        return self.origin_input_ids[:self.extend_end]

    def is_dllm(self):
        return False


def extend(req):
    batch = ScheduleBatch(reqs=[req], batch_is_full=False)
    batch.device, batch.return_logprob = "cpu", False
    batch.model_config = SimpleNamespace(is_encoder_decoder=False, vocab_size=32)
    ScheduleBatch.prepare_for_extend(batch)
    return [req.cached_tokens, req.already_computed]


def chunk_cached(out):
    saved = schedule_batch.alloc_for_extend, schedule_batch.get_exec, schedule_batch.SamplingBatchInfo
    schedule_batch.alloc_for_extend = lambda batch: (None, None, None)
    schedule_batch.get_exec = lambda: SimpleNamespace(
        features=SimpleNamespace(enable_encoder_swa_bounded_replay=False),
        mamba=SimpleNamespace(enable_mamba_extra_buffer=False))
    schedule_batch.SamplingBatchInfo = SimpleNamespace(from_schedule_batch=lambda batch, vocab_size: None)
    try:
        chunked, seen = ChunkReq(150, 0, 64), []
        for start in (0, 64, 128):  # a cold 150-token prompt in chunks of 64
            chunked.prefix_len, chunked.extend_end = start, min(start + 64, 150)
            seen.append(extend(chunked))
        out["chunked_cold"] = seen  # [cached_tokens, already_computed] after each chunk
        out["one_extend_prefix_hit_10"] = extend(ChunkReq(30, 10, 30))
    finally:
        schedule_batch.alloc_for_extend, schedule_batch.get_exec, schedule_batch.SamplingBatchInfo = saved


both("mut_chunk_cached_tokens_inflated", chunk_cached)


class MergeBatch:
    def __init__(self, reqs, chunked_req=None):
        self.reqs, self.chunked_req = list(reqs), chunked_req
        self.forward_mode = SimpleNamespace(is_extend=lambda: True)
        self.batch_is_full = self.is_prefill_only = False

    def batch_size(self):
        return len(self.reqs)

    def is_empty(self):
        return not self.reqs

    def filter_batch(self, reqs_to_exclude=None, keep_indices=None):
        self.reqs = [r for r in self.reqs if r not in (reqs_to_exclude or [])]

    def merge_batch(self, other):
        self.reqs.extend(other.reqs)


class MergeScheduler:
    """get_next_batch_to_run on a PP micro-batch whose last_batch ran a
    middle chunk of 'chunked' (self.chunked_req is None: its last chunk was
    admitted in another micro-batch); no prefill, no decode this step."""
    dllm_config = chunked_req = scheduler_stage_metrics = None
    enable_hisparse = require_mlp_sync = False

    def __init__(self):
        self.dp_attn_adapter = SimpleNamespace(maybe_prepare_mlp_sync_batch=lambda ret, need_sync: ret,
                                               maybe_convert_decode_to_extend=lambda ret: ret)
        self.ngram_embedding_manager = SimpleNamespace(prepare_for_forward=lambda ret, chunked_req: ret)

    def process_pending_chunked_abort(self):
        pass

    def _process_hicache_events(self):
        pass

    def _should_defer_prefill(self, running_batch):
        return True

    def update_running_batch(self, batch):
        return None

    def _arm_prefill_decode_interval(self, ret):
        pass


def stale_merge(out):
    last = MergeBatch(["chunked", "admitted"], chunked_req="chunked")
    plan = sched.Scheduler.get_next_batch_to_run(MergeScheduler(), MergeBatch(["decoding"]), last)
    out["running"] = plan.running_batch.reqs
    out["last_batch_chunked_req"] = last.chunked_req


both("mut_pp_chunked_req_merged_twice", stale_merge)


class FinishingReq:
    def __init__(self, rid):
        self.rid, self.beam_group = rid, None

    def next_output_finishes_by_length(self):
        return True


def finishing_inflight(out):
    in_queued, not_queued = FinishingReq("in_queued_decode"), FinishingReq("not_in_queued_batch")
    fake = SimpleNamespace(enable_skip_finishing_decode=True, result_queue=deque([(FakeBatch([in_queued]), None)]))
    batch = FakeBatch([in_queued, not_queued])  # both one token short of max_new_tokens
    out["queued_decode"] = [r.rid for r in sched.Scheduler._reqs_finishing_inflight(fake, batch)]
    fake.result_queue = deque([(FakeBatch([FinishingReq("prefilled")]), None)])  # a prefill was queued instead
    out["queued_prefill"] = [r.rid for r in sched.Scheduler._reqs_finishing_inflight(fake, batch)]


both("mut_overlap_drops_last_token_req", finishing_inflight)


def stop_or_eos(out):
    def check(stop_token_ids, eos_token_ids, token):
        fake = SimpleNamespace(sampling_params=SimpleNamespace(ignore_eos=False, stop_token_ids=stop_token_ids),
                               eos_token_ids=eos_token_ids, tokenizer=None, output_ids=array("q", [3, token]),
                               finished_reason=None, finished_len=None)
        return [Req._check_token_based_finish(fake, fake.output_ids[-1:]), fake.finished_len]

    out["stop_token_model_with_eos"] = check({5}, {2}, 5)
    out["eos_token"] = check({5}, {2}, 2)
    out["stop_token_model_without_eos"] = check({5}, None, 5)


both("mut_stop_ids_masked_by_eos", stop_or_eos)


class FlushScheduler:
    """What flush_cache reads; idle unless a request is queued (ignore_waiting aside)."""

    def __init__(self, paused, queued):
        self._engine_paused, self.waiting_queue = paused, ["retracted"] * queued
        self.running_batch, self.last_batch, self.draft_worker, self.reset = FakeBatch(), "last", None, []
        self.tree_cache = SimpleNamespace(reset=lambda: self.reset.append("tree"))
        self.req_to_token_pool = SimpleNamespace(clear=lambda: self.reset.append("rows"),
                                                 reset_aux_cache_allocator=lambda: None)
        self.token_to_kv_pool_allocator = SimpleNamespace(clear=lambda: self.reset.append("kv"))
        self.grammar_manager = SimpleNamespace(clear=lambda: None)
        self.metrics_reporter = SimpleNamespace(reset_metrics=lambda: None, is_stats_logging_rank=False)

    def is_fully_idle(self, for_health_check=False, ignore_waiting=False):
        return ignore_waiting or not self.waiting_queue


def paused_flush(out):
    for label, paused, queued in (("paused_queued", True, 1), ("unpaused_queued", False, 1),
                                  ("paused_empty", True, 0)):
        fake = FlushScheduler(paused, queued)
        out[label] = [sched.Scheduler.flush_cache(fake, empty_cache=False), fake.reset]


both("mut_flush_refused_while_paused", paused_flush)


def admission_lock(out):
    budget = []
    adder = SimpleNamespace(tree_cache=SimpleNamespace(lock=lambda node: ["lock", node]), can_run_list=[],
                            new_chunked_req=None,
                            _update_prefill_budget=lambda *args, **kwargs: budget.append(list(args[:3])),
                            _request_slot_reserve_for_req=lambda req, extend_input_len: 0,
                            _account_prefill_cache_admission=lambda req, prefix_len: None)
    req = SimpleNamespace(rid="prefix_hit", prefix_len=5, last_node="matched_node", lock=None, retracted_stain=False,
                          extend_end=None)
    admission = SimpleNamespace(prefix_len=5, extend_len=7, max_new_tokens=4, is_chunked=False, replay_len=0)
    PrefillAdder._commit_prefill_admission(adder, req, admission, 0)
    out["lock"], out["extend_end"] = req.lock, req.extend_end
    out["admitted"], out["budget"] = [r.rid for r in adder.can_run_list], budget


both("mut_admission_skips_prefix_lock", admission_lock)

# the copied bodies of the second blind set: a source that differs is refused
report["digest_guard_blind2"] = {}


def stand_in(self, *args, batch=None, new_accepted_tokens=None, empty_cache=True, req=None, admission=None,
             mamba_gap_reserve=0):
    return None


for name, owner, attr in (("mut_abort_misses_unmerged_prefill", sched.Scheduler, "_collect_inflight_batches"),
                          ("mut_overlap_drops_last_token_req", sched.Scheduler, "_reqs_finishing_inflight"),
                          ("mut_stop_ids_masked_by_eos", Req, "_check_token_based_finish"),
                          ("mut_flush_refused_while_paused", sched.Scheduler, "flush_cache"),
                          ("mut_admission_skips_prefix_lock", PrefillAdder, "_commit_prefill_admission")):
    before = snapshot()
    try:
        setattr(owner, attr, stand_in)
        try:
            mutants.MUTANTS[name].install(sched)
            report["digest_guard_blind2"][name] = "installed"
        except PatchError as exc:
            report["digest_guard_blind2"][name] = str(exc)
    finally:
        report["restored"] &= restore(before)

# a copied body whose source differs is refused (the fill-ids refresh)
before = snapshot()
try:
    def refresh_fill_ids(self):
        return None
    Req.refresh_fill_ids = refresh_fill_ids
    try:
        mutants.MUTANTS["mut_fill_ids_refresh_discards_append"].install(sched)
        report["digest_guard_fill_ids"] = "installed"
    except PatchError as exc:
        report["digest_guard_fill_ids"] = str(exc)
finally:
    report["restored"] &= restore(before)

print("@@REPORT@@" + json.dumps(report, default=str))
'''


def start_child_report(directory):
    """The child that installs every mutant on the installed release, started
    (its output in files under ``directory``); conftest.py starts it when
    collection ends, so its imports of SGLang (~20 s here) run beside the
    tests before this module's."""
    # A file, not ``-c``: the digest guard reads the source of a function the child defines.
    script = directory / "install_each.py"
    script.write_text(textwrap.dedent(CHILD))
    out, err = open(directory / "stdout.txt", "w"), open(directory / "stderr.txt", "w")
    # without what importing SGLang sets (this process may have imported it): the child reports it
    env = {k: v for k, v in os.environ.items() if k not in sglang_compat.IMPORT_SET_ENV}
    proc = subprocess.Popen([sys.executable, str(script)], cwd=ROOT, stdout=out, stderr=err, text=True,
                            env={**env, "PYTHONPATH": os.pathsep.join(
                                p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)})
    out.close()
    err.close()
    return proc, directory


@pytest.fixture(scope="module")
def child_report(request, tmp_path_factory):
    try:
        import sglang  # noqa: F401
    except ImportError:
        pytest.skip("SGLang is not installed in this interpreter")
    started = request.config.stash.get(CHILD_REPORT, None)
    proc, directory = started if started is not None else start_child_report(tmp_path_factory.mktemp("mutants"))
    try:
        proc.wait(timeout=240)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    stdout, stderr = (directory / "stdout.txt").read_text(), (directory / "stderr.txt").read_text()
    marker = "@@REPORT@@"
    line = next((l for l in stdout.splitlines() if l.startswith(marker)), None)
    assert proc.returncode == 0 and line, (stdout[-3000:] + stderr[-5000:])
    return json.loads(line[len(marker):])


@pytest.mark.parametrize("name", list(mutants.MUTANTS))
def test_installs_on_the_installed_release_keeping_wrapped(child_report, name):
    rows = child_report["install"][name]
    assert isinstance(rows, list), rows  # else: the install's error
    patched = [r for r in rows if r["callable"]]
    assert patched, f"{name} changed nothing"
    for row in patched:
        assert row["wrapped_is_previous"], f"{name}: {row['where']}.{row['attr']} lacks __wrapped__ = the original"


def test_install_changes_only_its_own_place(child_report):
    where = {name: {(r["where"], r["attr"]) for r in rows} for name, rows in child_report["install"].items()}
    assert where["mut_pp_drain_first_slot_only"] == {
        ("sglang.srt.managers.scheduler.Scheduler", "_pp_microbatches_drained")}
    assert where["mut_abort_keeps_row"] == {("sglang.srt.mem_cache.memory_pool.ReqToTokenPool", "free")}
    assert where["mut_kv_free_drops_last_index"] == {
        ("sglang.srt.mem_cache.allocator.token.TokenToKVPoolAllocator", "free")}
    release = where["mut_release_without_checkpoint_keeps_lock"]
    assert ("sglang.srt.managers.scheduler", "release_kv_cache") in release
    assert ("sglang.srt.mem_cache.common", "release_kv_cache") in release
    assert {attr for _, attr in release} == {"release_kv_cache"}
    assert where["mut_retract_keeps_kv"] == {("sglang.srt.managers.schedule_batch", "release_req")}
    assert where["mut_merge_batch_rows_other_first"] == {
        ("sglang.srt.managers.schedule_batch.ScheduleBatch", "merge_batch")}
    assert where["mut_checkpoint_row_keeps_duplicate_slots"] == {
        ("sglang.srt.mem_cache.unified_radix_cache.UnifiedRadixCache", "checkpoint")}
    assert where["mut_insert_dedup_starts_at_inserted_len"] == {
        ("sglang.srt.mem_cache.unified_radix_cache.UnifiedRadixCache", "insert")}
    assert where["mut_prefill_budget_ignores_admitted_extend"] == {
        ("sglang.srt.mem_cache.prefill_budget.PrefillBudget", "reserve")}
    assert where["mut_stream_resends_last_token"] == {
        ("sglang.srt.managers.scheduler_components.output_streamer._GenerationStreamAccumulator", "accept")}
    assert where["mut_chunked_prefill_answer_withheld"] == {
        ("sglang.srt.managers.scheduler_components.output_streamer.SchedulerOutputStreamer", "stream_output")}
    for name, method in (("mut_prefix_match_takes_whole_prompt", "_compute_max_prefix_len"),
                         ("mut_fill_ids_refresh_discards_append", "refresh_fill_ids"),
                         ("mut_stop_token_checked_one_step_late", "_check_token_based_finish")):
        assert where[name] == {("sglang.srt.managers.schedule_batch.Req", method)}, name
    scheduler = "sglang.srt.managers.scheduler.Scheduler"
    for name, method in (("mut_abort_misses_unmerged_prefill", "_collect_inflight_batches"),
                         ("mut_abort_queued_no_reply", "abort_request"),
                         ("mut_pp_chunked_req_merged_twice", "get_next_batch_to_run"),
                         ("mut_overlap_drops_last_token_req", "_reqs_finishing_inflight"),
                         ("mut_flush_refused_while_paused", "flush_cache")):
        assert where[name] == {(scheduler, method)}, name
    assert where["mut_chunk_cached_tokens_inflated"] == {
        ("sglang.srt.managers.schedule_batch.ScheduleBatch", "prepare_for_extend")}
    assert where["mut_stop_ids_masked_by_eos"] == {
        ("sglang.srt.managers.schedule_batch.Req", "_check_token_based_finish")}
    assert where["mut_admission_skips_prefix_lock"] == {
        ("sglang.srt.managers.schedule_policy.PrefillAdder", "_commit_prefill_admission")}
    # No two mutants patch the same attribute: each is a different place. The
    # one exception: the two blind sets' authors each chose the stop-token
    # check, with different bugs (the token read one step late; the EOS line
    # overwriting the stop-token match).
    shared = {("sglang.srt.managers.schedule_batch.Req", "_check_token_based_finish"):
              {"mut_stop_token_checked_one_step_late", "mut_stop_ids_masked_by_eos"}}
    seen = {}
    for name, places in where.items():
        for place in places:
            if place in seen and shared.get(place) == {name, seen[place]}:
                continue
            assert place not in seen, f"{name} and {seen[place]} both patch {place}"
            seen[place] = name


def test_what_importing_sglang_sets_in_the_environment_is_left_out_of_a_template_key(child_report):
    """``sglang_compat.IMPORT_SET_ENV`` is what importing the installed SGLang
    sets (this child's fresh interpreter, measured): a harness process that
    imported SGLang itself must still find the process template its first
    server started (user_side/templates.py leaves these out of its key)."""
    from scripted_runtime.user_side import templates

    added = child_report["import_env"]
    assert added and set(added) <= set(sglang_compat.IMPORT_SET_ENV), added
    assert templates.base_env({"HOME": "/h", **{k: "x" for k in added}}, "/site") == templates.base_env(
        {"HOME": "/h"}, "/site")


def test_restored_between_mutants(child_report):
    assert child_report["restored"]


@pytest.mark.parametrize("label", ["fake_module", "fake_scheduler"])
def test_a_foreign_module_gets_patch_error_never_another_exception(child_report, label):
    for name, outcome in child_report[label].items():
        assert not outcome.startswith("OTHER"), f"{name} on {label}: {outcome}"
        if label == "fake_module":
            assert outcome.startswith("PatchError") and "0.5.23" in outcome, (name, outcome)


def test_a_replaced_event_loop_keeps_crash_reporting(child_report):
    for name, out in child_report["crash_reporting"].items():
        assert out == {"reports_crashes": True, "wrapped_is_hooked_original": True}, name
    assert len(child_report["crash_reporting"]) == 2


def test_copied_loop_bodies_are_guarded_by_digest(child_report):
    assert "differs from the 0.5.23 body" in child_report["digest_guard"]
    assert "differs from the 0.5.23 body" in child_report["digest_guard_fill_ids"]
    guards = child_report["digest_guard_blind2"]
    assert sorted(guards) == sorted(["mut_abort_misses_unmerged_prefill", "mut_overlap_drops_last_token_req",
                                     "mut_stop_ids_masked_by_eos", "mut_flush_refused_while_paused",
                                     "mut_admission_skips_prefix_lock"])
    for name, outcome in guards.items():
        assert "differs from the 0.5.23 body" in outcome and name in outcome, (name, outcome)


def test_behaviour_on_fakes(child_report):
    b = child_report["behaviour"]
    for name, out in b.items():
        assert isinstance(out, dict), f"{name}: {out}"
    assert b["mut_pp_drain_first_slot_only"] == {"slot1_busy_says_drained": True, "slot0_busy_says_drained": False}
    assert b["event_loop_normal unmutated"]["calls"] == ["ingest", "paused"]
    assert b["mut_normal_loop_ignores_pause"]["calls"] == ["ingest", "schedule", "idle"]
    assert b["event_loop_overlap unmutated"] == {"queued": 1, "processed": [["result", 1]]}
    assert b["mut_overlap_skips_emptied_last_batch_result"] == {"queued": 2, "processed": []}
    assert b["mut_abort_keeps_row"] == {"aborted_row_back": 0, "aborted_row_forgotten": True,
                                        "finished_row_back": 1}
    assert b["mut_chunk_alloc_ignores_held_row"] == {"moved": True, "old_row_free": False, "rows_taken": 2}
    # 8 taken: a single free is intact, a free of 3 returns 2, a group of 2+2 is one free of 4 that returns 3.
    assert b["mut_kv_free_drops_last_index"] == {"start": 8, "after_single": 9, "after_three": 11,
                                                 "after_group_of_four": 14}
    assert b["mut_prune_keeps_aborted"] == {"kept": ["aborted", "running"]}
    assert b["is_fully_idle unmutated"] == {"idle_with_last_batch": False}
    assert b["mut_idle_gate_ignores_last_batch"] == {"idle_with_last_batch": True, "last_batch_kept": True}
    assert b["flush_cache_after_weight_update unmutated"] == {"answer": [False], "flushed": 0}
    assert b["mut_update_weights_flush_skips_idle_check"] == {"answer": [True, "ok"], "flushed": 1,
                                                              "gate_restored": True}


def test_blind_mutants_behaviour_on_fakes(child_report):
    """What each mutant written blind changes, next to the unmutated release
    on the same fake."""
    b = child_report["behaviour"]
    for name in BLIND:
        assert isinstance(b[name], dict) and isinstance(b[name + " unmutated"], dict), (name, b.get(name))
    # merge_batch: rows and lengths other-first, reqs and input ids self-first; a merge into an empty batch is intact
    merged = {"reqs": ["a", "b", "c"], "input_ids": [103, 104, 107], "into_empty_rows": [7]}
    assert b["mut_merge_batch_rows_other_first unmutated"] == {
        **merged, "rows": [3, 4, 7], "rows_cpu": [3, 4, 7], "seq_lens": [10, 11, 20]}
    assert b["mut_merge_batch_rows_other_first"] == {
        **merged, "rows": [7, 3, 4], "rows_cpu": [7, 3, 4], "seq_lens": [20, 10, 11]}
    # checkpoint: the row keeps its own (freed) duplicates 11..14 instead of the tree's 1..4; protection moves on
    assert b["mut_checkpoint_row_keeps_duplicate_slots unmutated"] == {"row": [1, 2, 3, 4, 15, 16], "protected": 4}
    assert b["mut_checkpoint_row_keeps_duplicate_slots"] == {"row": [11, 12, 13, 14, 15, 16], "protected": 4}
    # the match may take all 10 tokens; the logprob cap still applies
    assert b["mut_prefix_match_takes_whole_prompt unmutated"] == {"of_10": 9, "of_10_logprob_from_3": 3}
    assert b["mut_prefix_match_takes_whole_prompt"] == {"of_10": 10, "of_10_logprob_from_3": 3}
    # the insert's duplicate boundary: 0 for a prefix hit's first checkpoint, unchanged once it inserted
    assert b["mut_insert_dedup_starts_at_inserted_len unmutated"] == {"prev_prefix_lens_seen": [5, 5],
                                                                      "caller_params_unchanged": True}
    assert b["mut_insert_dedup_starts_at_inserted_len"] == {"prev_prefix_lens_seen": [0, 5],
                                                            "caller_params_unchanged": True}
    # reserve(10 extend, 4 decode, 2 extra), page 1: 10 + 1 + 2 + 4 and 10 + 1 + 2; mutated only the 4
    assert b["mut_prefill_budget_ignores_admitted_extend unmutated"] == {"total_offset": 17, "current_offset": 13}
    assert b["mut_prefill_budget_ignores_admitted_extend"] == {"total_offset": 4, "current_offset": 0}
    # retraction: the release frees from the protected length (4) up to the owned one (9): mutated, nothing
    assert b["mut_retract_keeps_kv unmutated"] == {"calls": [["release", 4, False], ["reset"]]}
    assert b["mut_retract_keeps_kv"] == {"calls": [["release", 9, False], ["reset"]]}
    # the rebuild at first admission works; the append of a later token is lost
    assert b["mut_fill_ids_refresh_discards_append unmutated"] == {
        "first_admission": [1, 2, 3, 7, 8], "after_one_more_token": [1, 2, 3, 7, 8, 9]}
    assert b["mut_fill_ids_refresh_discards_append"] == {
        "first_admission": [1, 2, 3, 7, 8], "after_one_more_token": [1, 2, 3, 7, 8]}
    # three outputs of a streamed request generating 4, 5, 6: each partial output's last token comes again
    assert b["mut_stream_resends_last_token unmutated"] == {"received": [4, 5, 6]}
    assert b["mut_stream_resends_last_token"] == {"received": [4, 4, 5, 5, 6]}
    # the finished last chunk of a chunked prompt is left out; the others stream as before
    assert b["mut_chunked_prefill_answer_withheld unmutated"] == {"streamed": [
        [["last_chunk_finished", "one_chunk", "decoding", "middle_chunk"], "middle_chunk"]]}
    assert b["mut_chunked_prefill_answer_withheld"] == {"streamed": [
        [["one_chunk", "decoding", "middle_chunk"], "middle_chunk"]]}
    # stop token 5: seen one step late (finished_len 3: the stop and one token after it), never as first token
    assert b["mut_stop_token_checked_one_step_late unmutated"] == {
        "stop_first": [True, 1], "stop_second": [True, 2], "one_after_stop": [False, None],
        "two_after_stop": [False, None]}
    assert b["mut_stop_token_checked_one_step_late"] == {
        "stop_first": [False, None], "stop_second": [False, None], "one_after_stop": [True, 3],
        "two_after_stop": [False, None]}


def test_second_blind_set_behaviour_on_fakes(child_report):
    """What each mutant of the second blind set changes, next to the
    unmutated release on the same fake."""
    b = child_report["behaviour"]
    for name in BLIND2:
        assert isinstance(b[name], dict) and isinstance(b[name + " unmutated"], dict), (name, b.get(name))
    # the batches an abort scans: last_batch (pp=1) and the in-flight micro-batches (PP) are left out
    assert b["mut_abort_misses_unmerged_prefill unmutated"] == {
        "pp1": ["running", "last_prefill"], "pp4": ["running0", "running1", "mb0", "mb1"],
        "pp1_polling": ["running", "last_prefill", "queued"]}
    assert b["mut_abort_misses_unmerged_prefill"] == {
        "pp1": ["running"], "pp4": ["running0", "running1"], "pp1_polling": ["running", "queued"]}
    # the queued request is popped and released either way; mutated, it gets no answer
    popped = {"queue": ["other"], "released": ["queued"], "send_restored": True}
    assert b["mut_abort_queued_no_reply unmutated"] == {**popped, "answered": ["queued"]}
    assert b["mut_abort_queued_no_reply"] == {**popped, "answered": []}
    # a cold 150-token prompt in chunks of 64: the earlier chunks count as cached (128); one extend is intact
    assert b["mut_chunk_cached_tokens_inflated unmutated"] == {
        "chunked_cold": [[0, 64], [0, 128], [0, 150]], "one_extend_prefix_hit_10": [10, 30]}
    assert b["mut_chunk_cached_tokens_inflated"] == {
        "chunked_cold": [[0, 0], [64, 64], [128, 128]], "one_extend_prefix_hit_10": [10, 10]}
    # the stale micro-batch's last_batch still names the chunked request: mutated, it is merged too
    assert b["mut_pp_chunked_req_merged_twice unmutated"] == {"running": ["decoding", "admitted"],
                                                              "last_batch_chunked_req": "chunked"}
    assert b["mut_pp_chunked_req_merged_twice"] == {"running": ["decoding", "chunked", "admitted"],
                                                    "last_batch_chunked_req": "chunked"}
    # one token short of max_new_tokens: mutated, excluded even when the queued batch does not hold it
    assert b["mut_overlap_drops_last_token_req unmutated"] == {"queued_decode": ["in_queued_decode"],
                                                               "queued_prefill": []}
    assert b["mut_overlap_drops_last_token_req"] == {
        "queued_decode": ["in_queued_decode", "not_in_queued_batch"],
        "queued_prefill": ["in_queued_decode", "not_in_queued_batch"]}
    # stop token 5, EOS 2: the stop token is lost only where the model declares EOS ids
    assert b["mut_stop_ids_masked_by_eos unmutated"] == {
        "stop_token_model_with_eos": [True, 2], "eos_token": [True, 2], "stop_token_model_without_eos": [True, 2]}
    assert b["mut_stop_ids_masked_by_eos"] == {
        "stop_token_model_with_eos": [False, None], "eos_token": [True, 2],
        "stop_token_model_without_eos": [True, 2]}
    # a flush while paused with a request queued is refused; unpaused, or with an empty queue, as before
    flushed = [True, ["tree", "rows", "kv"]]
    assert b["mut_flush_refused_while_paused unmutated"] == {
        "paused_queued": flushed, "unpaused_queued": [False, []], "paused_empty": flushed}
    assert b["mut_flush_refused_while_paused"] == {
        "paused_queued": [False, []], "unpaused_queued": [False, []], "paused_empty": flushed}
    # admission: the request is admitted and charged as before, but holds no lock on its matched prefix
    admitted = {"extend_end": 12, "admitted": ["prefix_hit"], "budget": [[5, 7, 4]]}
    assert b["mut_admission_skips_prefix_lock unmutated"] == {**admitted, "lock": ["lock", "matched_node"]}
    assert b["mut_admission_skips_prefix_lock"] == {**admitted, "lock": None}
