"""The output oracle's reference cache on real servers: a reference one
server computed is on disk and read back instead of run again, also by a
server of another pipeline topology (the same key: references do not
depend on it, and the two servers' own runs agree)."""
from __future__ import annotations

import json
from pathlib import Path

from tests.helpers import run_ok

# a prompt no other test or program draws (the explorer's families are runs of one token pattern)
PROMPT = [7, 300, 11, 42, 9, 250, 13, 77, 5, 401, 3]


def script_reference(ctx, prompt, forget=False):
    """The reference of ``prompt``, and where it came from. ``forget``: drop
    it from this server's memory first, as a new server process of the same
    key starts (nothing in memory, the file on disk)."""
    from scripted_runtime.scheduler_side import output_oracle

    key = (output_oracle.weights_fingerprint(ctx.scheduler), tuple(prompt))
    if forget:
        output_oracle._references.pop(key, None)
    before = dict(output_oracle.computed)
    ref, comparable = yield from output_oracle.reference(ctx, tuple(prompt), 4)
    disk = output_oracle._disk_cache(ctx.scheduler)
    return {"ref": list(ref), "computed": output_oracle.computed["references"] - before["references"],
            "from_cache": output_oracle.computed["from_cache"] - before["from_cache"],
            "file": str(disk.path) if disk is not None else None}


def test_a_reference_is_computed_once_per_key_and_read_back_from_disk(server_pool):
    overlap = server_pool.get("pp1-overlap")
    first = run_ok(overlap, script_reference, PROMPT).value
    assert (first["computed"], first["from_cache"]) == (1, 0), first
    saved = json.loads(Path(first["file"]).read_text())
    assert any(row[1] == PROMPT and row[2] == first["ref"] for row in saved["references"])
    assert "disable_overlap_schedule" not in saved["key"]["engine"] and "pp_size" not in saved["key"]["engine"]

    again = run_ok(overlap, script_reference, PROMPT, forget=True).value
    assert (again["computed"], again["from_cache"]) == (0, 1), again
    assert again["ref"] == first["ref"] and again["file"] == first["file"]

    normal_server = server_pool.get("pp1-normal")
    normal = run_ok(normal_server, script_reference, PROMPT, forget=True).value
    assert (normal["computed"], normal["from_cache"]) == (0, 1), "the other loop reads the same file"
    assert normal["file"] == first["file"]
    own = run_ok(normal_server, script_run_alone, PROMPT).value
    assert own["out"] == first["ref"], "greedy outputs agree across the two loops"
    # the alone run also records its logprobs (the logprob contract's reference): one input logprob per
    # prompt token, the first None, and one per output token
    assert len(own["input"]) == len(PROMPT) and own["input"][0] is None and len(own["output"]) == len(own["out"])
    assert any(row[1] == PROMPT and len(row[4]["input"]) == len(PROMPT) for row in saved["references"])


def script_run_alone(ctx, prompt):
    """The prompt run alone on this server, the cache left out."""
    from scripted_runtime.scheduler_side import output_oracle

    out, _, logprobs = yield from output_oracle._run_alone(ctx, tuple(prompt), 4)
    return {"out": list(out), **logprobs}
