#!/usr/bin/env bash
# The known-race corpus on a GPU runner, with a real small model (Qwen2.5-0.5B
# config, dummy weights: no hub access needed).
#   bash ci/gpu_corpus.sh          # 1 GPU: pp=1 overlap scenarios
#   bash ci/gpu_corpus.sh --pp 4   # 4 GPUs: the pp=4 scenarios
# Exit 0 only when every scenario passed on the installed (fixed) release.
set -euo pipefail
cd "$(dirname "$0")/.."
PP=1
if [ "${1:-}" = "--pp" ]; then PP="${2:?--pp needs 1 or 4}"; fi
bash ci/install.sh
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
S=scenarios
if [ "$PP" = "4" ]; then
  GPUS=$(nvidia-smi -L | wc -l)
  [ "$GPUS" -ge 4 ] || { echo "pp=4 needs 4 GPUs, this runner has $GPUS"; exit 2; }
  exec .venv/bin/scripted-runtime run --device cuda --pp 4 \
    $S/pp_flush_inflight.py:flush_with_chunk_in_flight \
    $S/demo.py:chunked_then_decode
fi
exec .venv/bin/scripted-runtime run --device cuda \
  $S/update_weights_stale_batch.py:update_weights_in_window \
  $S/chunked_row_reuse.py:chunked_row_reuse \
  $S/overlap_free_then_reuse.py:free_then_reuse \
  $S/pause_then_flush.py:in_place \
  $S/pause_then_flush.py:retract
