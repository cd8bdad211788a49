"""``scripted-runtime export``: a scenario as a test for SGLang's own
harness. Pure parts here (what travels, what is refused, the adapter on a
fake of SGLang's context); the run under SGLang's harness on CPU, on the
buggy and the fixed build, is in the slow lane (each run pays that
harness's ~65 s shutdown on CPU, bench/README.md)."""
from __future__ import annotations

import ast
import subprocess
import sys
import types
from pathlib import Path

import pytest

from scripted_runtime.user_side import export, export_adapter

ROOT = Path(__file__).resolve().parents[2]
CHUNKED = "scenarios/chunked_row_reuse.py:chunked_row_reuse"


def _cli(*args, timeout=60):
    return subprocess.run([sys.executable, "-m", "scripted_runtime.user_side.cli", "export", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def test_the_exported_file_imports_only_sglang_and_holds_the_scenario_as_written(tmp_path):
    out = tmp_path / "test_chunked_row_reuse.py"
    proc = _cli(CHUNKED, "-o", str(out), "--no-overlap")
    assert proc.returncode == 0, proc.stderr
    text = out.read_text()
    tree = ast.parse(text)
    imported = {n.module if isinstance(n, ast.ImportFrom) else a.name
                for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
                for a in (n.names if isinstance(n, ast.Import) else [None])}
    assert imported == {"__future__", "unittest", "sglang.test.scripted_runtime.test_case"}, imported
    original = (ROOT / "scenarios" / "chunked_row_reuse.py").read_text()
    body = original[original.index("def chunked_row_reuse"):]
    assert body.strip() in text  # the scenario's code, unchanged
    assert "class TestChunkedRowReuse(ScriptedTestCase):" in text and "disable_overlap_schedule=True" in text
    assert "device=" not in text and "load_format" not in text  # the CPU box's arguments stay here


@pytest.mark.parametrize("spec, words", [
    ("scenarios/pp_flush_inflight.py:flush_with_chunk_in_flight", "ctx.window_open (line 34)"),
    ("scenarios/demo.py:nothing_here", "no function 'nothing_here'"),
])
def test_what_does_not_travel_is_a_one_line_error(tmp_path, spec, words):
    proc = _cli(spec, "-o", str(tmp_path / "t.py"), "--pp", "4")
    assert proc.returncode == 2 and words in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "t.py").exists()


def test_an_explored_program_is_refused_naming_the_harness_import(tmp_path):
    from scripted_runtime.user_side.explore import actions as A

    path = tmp_path / "found.py"
    path.write_text(A.to_source([A.Start(100, 1, 4), A.Flush()]).text)
    with pytest.raises(export.ExportError, match="imports scripted_runtime.scheduler_side.explore"):
        export.render(str(path), "program", topology="pp1-normal")


class FakeUpstreamHandle:
    def __init__(self, rid, req):
        self.rid, self.req, self.finished, self.is_chunking, self.chunks_done, self.status = \
            rid, req, False, True, 1, "running"


def test_the_adapter_gives_a_scenario_our_api_over_sglangs_context():
    ns: dict = {}
    exec(export_adapter.source(), ns)
    kv = types.SimpleNamespace(req_pool_idx=5)
    req = types.SimpleNamespace(kv=kv, output_ids=[1, 2], finished=lambda: False)
    scheduler = types.SimpleNamespace(chunked_req=None)
    posted = []

    class FakeContext:
        def __init__(self):
            self.scheduler = scheduler

        def start_req(self, **kwargs):
            posted.append(kwargs)
            return FakeUpstreamHandle("r1", req)

        def pause_generation(self, *, mode):
            posted.append(("pause", mode))

        def engine_stats(self):
            return {}

        def is_fully_idle(self):
            return False

    def scenario(ctx):
        h = ctx.start_req(prompt_len=200, max_new_tokens=4, ignore_eos=True)
        yield from ctx.wait_for_window("chunked_between_chunks", max_steps=5)
        ctx.pause_generation("in_place")
        yield from ctx.steps(2)
        return h.req_pool_idx, h.output_ids, ctx.step

    gen = ns["_adapted"](scenario, FakeContext())
    next(gen)  # the window is closed: one iteration
    scheduler.chunked_req = req
    steps = 1 + sum(1 for _ in gen)
    assert steps == 3 and posted == [{"prompt_len": 200, "max_new_tokens": 4, "ignore_eos": True},
                                     ("pause", "in_place")]
