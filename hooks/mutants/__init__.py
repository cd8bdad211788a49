"""Mutants: plausible bugs planted in SGLang's scheduler path in-process, to
measure which the harness's checks catch (``scripted-runtime mutate``).

Each mutant is a ``Patch`` whose ``install`` receives the imported
``sglang.srt.managers.scheduler`` module and monkeypatches one place of the
0.5.23 scheduler path: a one-line or few-line change a real PR could make.
Replacements keep ``__wrapped__`` (the attribute they replaced); a target
that is missing, or a copied method body that no longer matches the source it
was copied from, raises ``PatchError`` ("... written against 0.5.23").

A mutant is declared where it is written: ``@mutant(name, topologies=...,
summary=..., expected=...)`` (``base.py``) on its ``_install_<name>``
function, whose docstring explains the bug, why it is plausible and how the
check sees it. The modules hold one family each: ``idle_gate`` (the idle
gate and the flush that trusts it), ``loops`` (the event loops and the
pause), ``pools`` (rows and KV slots), ``radix_locks``, ``batches``
(admission and pruning), ``hicache``, ``requests`` (how a request ends),
and four families written blind for issue 34 (item 5), without reading the
harness's checks (a fifth blind family, request semantics, adds to
``requests``): ``kv_content`` (KV content and slot mapping: the right number of
slots, the wrong ones), ``prefix_cache`` (prefix matching and insertion),
``kv_pressure`` (admission and retraction under KV pressure),
``stream_output`` (what a request's outputs send). A second set of eight
was written blind for issue 34 by another author, without reading the
harness's checks or what its explorer draws, and measured as external
patches before anyone read them: two new families, ``aborts`` (which
batches an abort scans, the answer of an aborted queued request) and
``chunked_prefill`` (a chunked prompt's cached-token count, the PP merge
after its last chunk), and one each added to ``batches``, ``requests``,
``idle_gate`` and ``radix_locks``. ``memory_occupation`` holds the
release/resume handlers' (issue 35, the RL weight-sync cycle), written
with the operations before the explorer drew them; ``runtime_ops`` the
runtime knobs', weight queries' and sessions' and ``lora`` LoRA serving's
(the admission's adapter budget, the memory pool's slots; issue 35), and
``priority`` priority scheduling's (the preemption threshold), each
written the same way. ``MUTANTS`` is the
table, in the kill table's row order (``ORDER`` below).

Every mutant lets the server's warm-up request (one short prompt, run to
its length, no abort, pause, flush or chunking) through, so the server
starts (``mut_length_cap_one_early`` ends it one token early, which SGLang
does not check; ``mut_fill_ids_refresh_discards_append`` caches less of it);
the scheduler-path bugs need an interleaving the explorer generates: an
abort, a pause, a flush, an update_weights, a chunked prompt, several
requests, a prefix hit, KV pressure, a stop token.

``expected`` names the check that should see the bug, in the words of
``scripted_runtime.user_side.mutate.caught_by``: ``invariant NAME``
(idle_gate, slot_ownership, radix_locks, pool_accounting, checked after every
iteration), ``end-state check`` (every request finishes or is aborted, the
engine goes idle, rows all free, KV free or evictable, no tree lock held),
``crash`` (SGLang's own asserts, or its idle leak check, which is strict by
default: SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE), or ``none today`` where
no check looks at what the bug breaks: a surviving mutant is a finding. The
mutants written blind say ``unknown (written blind)`` and then, in plain
words, what should notice the bug (a wrong output, a crash, a leak).
"""
from __future__ import annotations

from typing import Dict

# Each family module declares its mutants when imported.
from scripted_runtime.hooks.mutants import (aborts, batches, chunked_prefill, hicache, idle_gate,  # noqa: F401
                                            kv_content, kv_pressure, loops, lora, memory_occupation, pools,
                                            prefix_cache, priority, radix_locks, requests, runtime_ops,
                                            stream_output)
from scripted_runtime.hooks.mutants.aborts import COLLECT_INFLIGHT_BATCHES_DIGEST  # noqa: F401
from scripted_runtime.hooks.mutants.base import (ALL, BATCH_RESULT_PROCESSOR, FULL_COMPONENT, HICACHE, LORA,  # noqa: F401
                                                 PRIORITY,
                                                 MEM_CACHE_COMMON, MEMORY_POOL, OUTPUT_STREAMER, PATCHED_MODULES,
                                                 PP1, PREFILL_BUDGET, RELEASE, SCHEDULE_BATCH, SCHEDULE_POLICY,
                                                 TOKEN_ALLOCATOR, TP_WORKER, UNIFIED_RADIX_CACHE, WEIGHT_UPDATER,
                                                 in_order, source_digest)
from scripted_runtime.hooks.mutants.batches import REQS_FINISHING_INFLIGHT_DIGEST  # noqa: F401
from scripted_runtime.hooks.mutants.idle_gate import FLUSH_CACHE_DIGEST  # noqa: F401
from scripted_runtime.hooks.mutants.kv_pressure import REFRESH_FILL_IDS_DIGEST  # noqa: F401
from scripted_runtime.hooks.mutants.loops import EVENT_LOOP_NORMAL_DIGEST, EVENT_LOOP_OVERLAP_DIGEST  # noqa: F401
from scripted_runtime.hooks.mutants.radix_locks import COMMIT_PREFILL_ADMISSION_DIGEST  # noqa: F401
from scripted_runtime.hooks.mutants.requests import CHECK_TOKEN_BASED_FINISH_DIGEST  # noqa: F401
from scripted_runtime.hooks.patch_base import Patch

# The kill table's row order (``mutate`` runs and prints them so): the order
# the mutants were written in, kept across the split into families.
ORDER = (
    "mut_pp_drain_first_slot_only",
    "mut_normal_loop_ignores_pause",
    "mut_pause_retract_forgets_last_batch",
    "mut_abort_keeps_row",
    "mut_abort_double_free_kv",
    "mut_checkpoint_keeps_old_lock",
    "mut_release_without_checkpoint_keeps_lock",
    "mut_chunk_alloc_ignores_held_row",
    "mut_prune_keeps_aborted",
    "mut_idle_gate_ignores_last_batch",
    "mut_overlap_skips_emptied_last_batch_result",
    "mut_kv_free_drops_last_index",
    "mut_update_weights_flush_skips_idle_check",
    "mut_admission_drops_next_waiting",
    "mut_hicache_forward_skips_load_wait",
    "mut_hicache_write_through_skips_lock",
    "mut_hicache_host_evict_leaks",
    "mut_length_cap_one_early",
    "mut_release_keeps_cache_while_paused",
    "mut_resume_skips_static_state",
    "mut_micro_batch_limit_read_once",
    "mut_weight_checksum_cached",
    "mut_tensor_update_skips_flush",
    "mut_session_close_always_deferred",
    "mut_profile_num_steps_ignored",
    "mut_weight_version_event_names_new_version",
    "mut_lora_admission_forgets_running",
    "mut_lora_slot_keeps_stale_weights",
    # issue 35: the trainer's broadcast (written with the operation, before the explorer drew it)
    "mut_distributed_update_loads_into_no_runner",
    # grammar 11: the LoRA load from tensors (written with the operation, before the explorer drew it)
    "mut_lora_tensor_load_unnormalized",
    # priority scheduling (written with the priority contract, before the explorer drew a priority)
    "mut_priority_preemption_threshold_dropped",
    # written blind (issue 34, item 5)
    "mut_merge_batch_rows_other_first",
    "mut_checkpoint_row_keeps_duplicate_slots",
    "mut_prefix_match_takes_whole_prompt",
    "mut_insert_dedup_starts_at_inserted_len",
    "mut_prefill_budget_ignores_admitted_extend",
    "mut_retract_keeps_kv",
    "mut_fill_ids_refresh_discards_append",
    "mut_stream_resends_last_token",
    "mut_chunked_prefill_answer_withheld",
    "mut_stop_token_checked_one_step_late",
    # written blind, second set (issue 34)
    "mut_abort_misses_unmerged_prefill",
    "mut_abort_queued_no_reply",
    "mut_chunk_cached_tokens_inflated",
    "mut_pp_chunked_req_merged_twice",
    "mut_overlap_drops_last_token_req",
    "mut_stop_ids_masked_by_eos",
    "mut_flush_refused_while_paused",
    "mut_admission_skips_prefix_lock",
)

MUTANTS: Dict[str, Patch] = in_order(ORDER)
