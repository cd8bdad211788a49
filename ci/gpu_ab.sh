#!/usr/bin/env bash
# The cross-release A/B job on a GPU runner (1 GPU; set PP=4 on a 4-GPU runner
# for the PP scenario). Each release gets its own cached environment
# (~/.cache/scripted-runtime/envs, ~10 GB each, built once).
#   bash ci/gpu_ab.sh
# Exit 0 when every side started (the table shows which side fails which scenario).
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/install.sh
AB=(.venv/bin/scripted-runtime ab --device cuda)
S=scenarios
status=0
# Issue 18744 needs a GPU to fail: no write-after-read barrier before 0.5.13.
"${AB[@]}" $S/overlap_free_then_reuse.py:free_then_reuse --a sglang==0.5.12.post1 --b current || status=1
# Issue 14062: the weight updater's assert (<=0.5.21) vs a refused flush (0.5.22+).
"${AB[@]}" $S/update_weights_stale_batch.py:update_weights_in_window --a sglang==0.5.13 --b current || status=1
if [ "${PP:-1}" = "4" ]; then
  "${AB[@]}" --pp 4 $S/pp_flush_inflight.py:flush_with_chunk_in_flight \
    --a sglang==0.5.12.post1 --b sglang==0.5.13 || status=1
fi
exit $status
