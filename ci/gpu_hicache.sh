#!/usr/bin/env bash
# HiCache on a GPU runner (1 GPU), with a real small model (Qwen2.5-0.5B config,
# dummy weights): PR 19177's form, HiCache + CUDA graphs + speculative decoding.
#   bash ci/gpu_hicache.sh
# 1. HiCache with CUDA graphs on (SGLang's GPU defaults: kernel I/O backend, page_first
#    layout), the explorer's pp1-hicache pools: the demo and every HiCache scenario,
#    the transfer gate included.
# 2. The same plus NGRAM speculative decoding (no draft model needed), where the build
#    supports it: the demo and PR 19177's scenario.
# Exit 0 only when every scenario passed on the installed release.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/install.sh
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
S=scenarios/hicache.py
HICACHE=(--no-overlap --sglang-arg enable_hierarchical_cache=true --sglang-arg hicache_write_policy=write_through
         --sglang-arg max_total_tokens=400 --sglang-arg hicache_ratio=1.2 --sglang-arg disable_cuda_graph=false)
RUN=(.venv/bin/scripted-runtime run --device cuda "${HICACHE[@]}")
"${RUN[@]}" scenarios/demo.py:chunked_then_decode $S:host_pool_holds_backups $S:write_through_window \
  $S:load_back_window $S:host_eviction_accounted $S:held_load_read_by_forward $S:held_backup_survives_eviction
"${RUN[@]}" --sglang-arg speculative_algorithm=NGRAM \
  scenarios/demo.py:chunked_then_decode $S:held_load_read_by_forward
