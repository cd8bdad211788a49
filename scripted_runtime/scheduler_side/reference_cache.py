"""The output oracle's references on disk, shared by every server of one
build (scheduler process, driver rank).

A reference is the greedy output of a prompt run alone on an idle engine
(``output_oracle.reference``). It is determined by the build (the SGLang
code, the harness's oracle code, the patches and reverted fixes the server
runs with, except the workarounds of registered bugs, which change no
output), the engine arguments that change numerics or scheduling (dtype,
device, attention and sampling backends, chunk and page sizes, tensor
parallelism; not the pipeline topology, below),
the weights (the served and the update checkpoints' files, and the weights
fingerprint ``output_oracle`` keys each reference by) and the prompt. The
first part is this module's **key**: one JSON file per key under the cache
directory, holding every (weights fingerprint, prompt) -> reference the
servers of that key computed. A server whose key differs in anything
(another release, a mutant, another dtype, an edited SGLang file, a new
checkpoint) reads another file and computes its own.

The directory: ``$SCRIPTED_RUNTIME_REFERENCE_CACHE``, default
``~/.cache/scripted-runtime/references`` (beside the A/B environments);
``off`` turns the cache off (every server computes its references, as
before). Writes replace the file atomically after merging what is there,
so two servers of one key (a standby and the live one) lose nothing but
may compute a reference twice. A file that cannot be read is ignored (the
references are computed again); one that cannot be written is skipped.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

ENV_CACHE = "SCRIPTED_RUNTIME_REFERENCE_CACHE"
FORMAT = 2  # 2: an entry also holds the alone run's logprobs

# ServerArgs fields a reference may depend on: numerics (dtype, backends, device,
# quantization, tensor parallelism, which splits sums across ranks), how a prompt is cut
# and laid out (chunk, page and context sizes) and the weights' source. Not the pipeline
# topology (pp_size, the overlap loop, pp_async_batch_depth): a pipeline stage runs the
# same layers on the same inputs, and the 66 references of the CPU default (two weights,
# 33 prompts) were measured identical, tokens and margins, on pp1-overlap, pp1-normal and
# pp4 (2026-11-26, SGLang 0.5.23). So a pp4 server reads what a pp1 server of the same
# build computed; each server still runs one reference itself first and stops reading
# the cache if it disagrees (output_oracle.verify_disk_cache).
ENGINE_FIELDS = (
    "model_path", "load_format", "dtype", "kv_cache_dtype", "quantization", "device", "attention_backend",
    "prefill_attention_backend", "decode_attention_backend", "sampling_backend", "random_seed",
    "chunked_prefill_size", "page_size", "context_length", "tp_size", "dp_size",
    "enable_mixed_chunk", "enable_hierarchical_cache", "disable_radix_cache",
    "torch_compile_max_bs", "enable_torch_compile", "cpu_offload_gb",
)

# (output, comparable prefix, logprobs {"input": [...], "output": [...]} or None)
Entry = Tuple[List[int], int, Optional[Dict[str, list]]]


def cache_dir() -> Optional[Path]:
    """Where the reference files live, or None when the cache is off."""
    value = os.environ.get(ENV_CACHE, "")
    if value.strip().lower() == "off":
        return None
    return Path(value) if value else Path.home() / ".cache" / "scripted-runtime" / "references"


def _files_signature(root: Optional[str], pattern: str = "*") -> List[Any]:
    """(relative name, size, mtime_ns) of the files under ``root`` that match
    ``pattern``, sorted; [] when it is not a directory. Stat only: cheap
    enough for SGLang's ~1,500 source files at every server start."""
    if not root or not os.path.isdir(root):
        return []
    base = Path(root)
    out = []
    for path in base.rglob(pattern):
        try:
            st = path.stat()
        except OSError:
            continue
        if path.is_file():
            out.append((str(path.relative_to(base)), st.st_size, st.st_mtime_ns))
    return sorted(out)


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


def _file_signature(path: str) -> List[Any]:
    """(path, size, mtime_ns) of one file; [] when it cannot be read."""
    try:
        st = os.stat(path)
    except OSError:
        return []
    return [path, st.st_size, st.st_mtime_ns]


def key_of(scheduler: Any, harness_files: Sequence[str] = ()) -> Dict[str, Any]:
    """What a reference depends on besides the weights fingerprint and the
    prompt (see the module docstring), as a JSON-able dict.
    ``harness_files``: the harness's own sources a reference depends on (the
    oracle passes its module and the prompts')."""
    import sglang
    import torch

    from scripted_runtime import protocol

    args = getattr(scheduler, "server_args", None)
    sglang_dir = os.path.dirname(getattr(sglang, "__file__", "") or "")
    harness = hashlib.sha256()
    for path in harness_files:
        harness.update(Path(path).read_bytes())
    checkpoint = os.environ.get(protocol.ENV_CHECKPOINT)
    model_path = str(getattr(args, "model_path", "") or "")
    from scripted_runtime.hooks import workarounds

    # a registered bug's workaround changes when the loop waits, never what a request computes
    # (hooks/workarounds.py): the references of a build are the same with it or without it
    patches = workarounds.without_workarounds(protocol.listed(protocol.ENV_PATCHES))
    return {
        "format": FORMAT,
        "sglang": getattr(sglang, "__version__", "?"),
        "sglang_dir": sglang_dir,
        "sglang_sources": _digest(_files_signature(sglang_dir, "*.py")),
        "torch": getattr(torch, "__version__", "?"),
        # a reduction split over more threads may round differently (CPU_THREAD_ENV in user_side/server.py)
        "torch_threads": torch.get_num_threads(),
        "harness_oracle": harness.hexdigest(),
        "patches": patches,  # in order: a later patch may wrap an earlier one
        # a patch of the user's own file (PATH.py:ATTR): its file as it is now
        "patch_files": _digest([_file_signature(path)
                                for path in (s.split(":")[0] for s in patches) if path.endswith(".py")]),
        "reverted_fixes": sorted(protocol.listed(protocol.ENV_REVERT_FIXES)),
        "engine": {name: getattr(args, name, None) for name in ENGINE_FIELDS},
        "served_files": _digest(_files_signature(model_path)),
        "update_checkpoint": checkpoint or "",
        "update_files": _digest(_files_signature(checkpoint)) if checkpoint != model_path else "",
    }


class ReferenceCache:
    """The references of one key on disk: ``get`` reads the file once,
    ``put`` merges one new reference into it."""

    def __init__(self, directory: Path, key: Dict[str, Any]) -> None:
        self.key = key
        self.path = directory / f"{_digest(key)[:24]}.json"
        self._entries: Optional[Dict[Tuple[Any, Tuple[int, ...]], Entry]] = None
        self._read_mtime: Optional[int] = None  # the file's mtime when last read (None: absent)

    def _mtime(self) -> Optional[int]:
        try:
            return self.path.stat().st_mtime_ns
        except OSError:
            return None

    @staticmethod
    def _encode(fingerprint: Any, prompt: Tuple[int, ...], entry: Entry) -> List[Any]:
        logprobs = entry[2] if len(entry) > 2 else None
        return [list(fingerprint) if fingerprint is not None else None, list(prompt), list(entry[0]), entry[1],
                logprobs]

    @staticmethod
    def _decode(row: List[Any]) -> Tuple[Tuple[Any, Tuple[int, ...]], Entry]:
        fingerprint, prompt, output, comparable, logprobs = row
        fp = tuple(fingerprint) if fingerprint is not None else None
        if logprobs is not None:
            logprobs = {"input": [None if v is None else float(v) for v in logprobs["input"]],
                        "output": [float(v) for v in logprobs["output"]]}
        return (fp, tuple(int(t) for t in prompt)), ([int(t) for t in output], int(comparable), logprobs)

    def _read(self) -> Dict[Tuple[Any, Tuple[int, ...]], Entry]:
        self._read_mtime = self._mtime()
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        if not isinstance(data, dict) or data.get("key") != json.loads(json.dumps(self.key, default=str)):
            return {}  # another key's file under a colliding name, or an older format: not ours
        out = {}
        for row in data.get("references", ()):
            try:
                k, v = self._decode(row)
            except (TypeError, ValueError, KeyError):
                continue
            out[k] = v
        return out

    def entries(self) -> Dict[Tuple[Any, Tuple[int, ...]], Entry]:
        if self._entries is None:
            self._entries = self._read()
        return self._entries

    def get(self, fingerprint: Any, prompt: Tuple[int, ...]) -> Optional[Entry]:
        """The reference, or None. A miss reads the file again if another
        server of this key wrote it since (two live at once: the suite's
        pool, a standby beside the live server)."""
        key = (fingerprint, prompt)
        have = self.entries().get(key)
        if have is None and self._mtime() != self._read_mtime:
            self._entries = {**self._read(), **self._entries}
            have = self._entries.get(key)
        return have

    def put(self, fingerprint: Any, prompt: Tuple[int, ...], entry: Entry) -> None:
        """Add one reference and write the file (merged with what another
        server of this key wrote meanwhile; atomically replaced)."""
        merged = self._read()
        merged.update(self.entries())
        merged[(fingerprint, prompt)] = (list(entry[0]), int(entry[1]), entry[2] if len(entry) > 2 else None)
        self._entries = merged
        rows = [self._encode(fp, p, e) for (fp, p), e in merged.items()]
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".refs-", suffix=".json", dir=str(self.path.parent))
            with os.fdopen(fd, "w") as f:
                json.dump({"key": self.key, "references": rows}, f, default=str)
            os.replace(tmp, self.path)
        except OSError:
            pass  # a cache that cannot be written costs a recompute on the next server, nothing more
