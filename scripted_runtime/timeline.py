"""Step trace as a compact one-line-per-step timeline (pure; no SGLang).

A line reads, left to right: step, PP slot, what each holder holds
(``run`` running_batch, ``last`` last_batch, ``rq0`` result_queue[0],
``mb2`` mbs[2], ``rmb2`` running_mbs[2], ``lmb2`` last_mbs[2]) with the batch
mode as one letter (E extend, D decode, M mixed, I idle) and finished
requests starred, the chunked request, the waiting queue, rows and KV in
use, tree nodes/locked, then events: ``+op`` injected, ``=op:ok|REFUSED``
answered, ``{window}`` opened, ``!!invariant`` violated. The step that broke
an invariant is marked ``>>``.
"""
from __future__ import annotations

import json
import os
import re
from typing import Any, Dict, Iterable, List, Optional, Tuple

_LABELS = (
    (re.compile(r"^running_batch$"), "run"),
    (re.compile(r"^last_batch$"), "last"),
    (re.compile(r"^result_queue\[(\d+)\]$"), "rq"),
    (re.compile(r"^running_mbs\[(\d+)\]$"), "rmb"),
    (re.compile(r"^last_mbs\[(\d+)\]$"), "lmb"),
    (re.compile(r"^mbs\[(\d+)\]$"), "mb"),
)
_MODES = {"extend": "E", "decode": "D", "mixed": "M", "idle": "I", "prebuilt": "P"}


def short_label(label: str) -> str:
    for pattern, short in _LABELS:
        m = pattern.match(label)
        if m:
            return short + (m.group(1) if m.groups() else "")
    return label


def mode_letter(mode: Optional[str]) -> str:
    if not mode:
        return "?"
    return _MODES.get(mode, mode[:1].upper())


def seal(path: str) -> None:
    """Cut the NUL bytes a trace's writer left after its last line when its
    process died before closing it (the writer maps the file ahead of its
    text, ``scheduler_side/trace_record.TraceWriter``); a closed trace is
    left as it is."""
    with open(path, "r+b") as f:
        size = f.seek(0, os.SEEK_END)
        if not size:
            return
        f.seek(size - 1)
        if f.read(1) != b"\0":
            return
        f.seek(0)
        data = f.read()
        f.truncate(len(data.rstrip(b"\0")))


def load(path: str) -> Tuple[Dict[str, Any], List[Dict[str, Any]]]:
    """(header, records) of a JSONL trace file (NUL bytes after the last
    line, left by a writer that died, are ignored)."""
    header: Dict[str, Any] = {}
    records: List[Dict[str, Any]] = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.strip().strip("\0")
            if not line:
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{n}: not a JSON line ({exc.msg}); is this a scripted-runtime trace?") from None
            if "trace_format" in obj:
                header = obj
            else:
                records.append(obj)
    if not header and not records:
        raise ValueError(f"{path}: empty trace")
    return header, records


def _rids(rids: Iterable[str], limit: int = 5) -> str:
    rids = list(rids)
    text = ",".join(rids[:limit])
    return text + (f"+{len(rids) - limit}" if len(rids) > limit else "")


def format_line(rec: Dict[str, Any]) -> str:
    marker = ">>" if rec.get("violation") else "  "
    slot = rec.get("slot")
    head = f"{marker}{rec.get('step', '?'):>5} {'s' + str(slot) if slot is not None else '  '}"
    if rec.get("paused"):
        head += " P"
    else:
        head += "  "
    cells = []
    for label, batch in (rec.get("batches") or {}).items():
        cells.append(f"{short_label(label)}:{mode_letter(batch.get('mode'))}[{_rids(batch.get('rids', []))}]")
    if rec.get("chunked"):
        cells.append(f"chk:{rec['chunked']}")
    if rec.get("waiting"):
        cells.append(f"wait:[{_rids(rec['waiting'])}]")
    if not cells:
        cells.append("idle" if rec.get("fully_idle") else "-")
    rows_used = (rec.get("rows_total") or 0) - (rec.get("rows_free") or 0)
    kv_used = (rec.get("kv_total") or 0) - (rec.get("kv_free") or 0)
    res = f"rows {rows_used} kv {kv_used}"
    if rec.get("tree_nodes") is not None:
        res += f" tree {rec['tree_nodes']}n/{rec.get('tree_locked', 0)}L"
    events = []
    for op in rec.get("answers") or []:
        verdict = {True: "ok", False: "REFUSED", None: "?"}[op.get("success")]
        events.append(f"={op['op']}:{verdict}")
    for name in rec.get("windows_opened") or []:
        events.append("{" + name + "}")
    for name in rec.get("entered") or []:
        events.append("@" + name)
    for op in rec.get("ops") or []:
        events.append("+" + op["op"])
    for rid in rec.get("started") or []:
        events.append("+start(" + rid + ")")
    if rec.get("violation"):
        events.append("!!" + rec["violation"]["invariant"])
    line = f"{head} {' '.join(cells)} | {res}"
    if events:
        line += " | " + " ".join(events)
    return line


def format_timeline(records: List[Dict[str, Any]], *, last: Optional[int] = None,
                    header: Optional[Dict[str, Any]] = None) -> str:
    shown = records[-last:] if last else records
    lines = []
    if header:
        lines.append(
            f"trace of {header.get('script', '?')} on {header.get('loop', '?')} loop "
            f"(pp={header.get('pp_size', 1)}, sglang {header.get('sglang_version', '?')}); "
            f"invariants: {', '.join(header.get('invariants') or []) or 'off'}")
    if last and len(records) > len(shown):
        lines.append(f"  ... {len(records) - len(shown)} earlier steps not shown")
    lines.extend(format_line(r) for r in shown)
    return "\n".join(lines)
