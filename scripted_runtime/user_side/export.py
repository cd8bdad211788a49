"""``scripted-runtime export FILE:FUNC``: a scenario as a test for SGLang's
own harness (``sglang.test.scripted_runtime``, 0.5.13+), so a finding can go
into an SGLang pull request.

The exported file imports only SGLang and the standard library: the
scenario's source as written, an adapter giving it the scripted-runtime
context API over SGLang's ``ScriptedContext`` (``export_adapter.py``,
copied in), a script function ``run_FUNC`` and a ``ScriptedTestCase``
whose ``ENGINE_KWARGS`` are the topology's. The invariants, contracts and
output oracle are this harness's and do not travel: the exported test fails
where the scenario's own assertions (or a crash) fail it, which is what
``scripted-runtime run --no-invariants`` shows for the original.

A scenario that uses more than the adapter covers (``SUPPORTED``, the
windows in the adapter, ``start_req`` without ``input_ids``, no import of
``scripted_runtime``) is refused with a one-line error naming what.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any, Dict, List

from scripted_runtime.user_side import engine_config, export_adapter

SUPPORTED = frozenset({"scheduler", "step", "start_req", "pause_generation", "continue_generation", "abort_all",
                       "abort", "flush_cache", "describe", "steps", "wait_until", "wait_finished",
                       "wait_for_window"})
WINDOWS = frozenset({"chunked_between_chunks", "finished_not_pruned"})
MODEL_PLACEHOLDER = "Qwen/Qwen3-0.6B"  # SGLang's small test model (sglang.test.scripted_runtime_chunked_helpers)
# Our engine arguments an exported test drops: the harness's own, or the CPU box's
# (``upstream_run`` adds those back to run it here).
DROPPED_ENGINE_ARGS = ("device", "model_path", "skip_server_warmup", "log_level", "host", "port",
                       "attention_backend", "dtype", "disable_cuda_graph", "sampling_backend", "load_format")


class ExportError(ValueError):
    """The scenario cannot be exported (one line: what it uses that does not travel)."""


def _problems(tree: ast.Module, func: str) -> List[str]:
    problems = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            if any(n == "scripted_runtime" or n.startswith(("scripted_runtime.", "hooks")) for n in names):
                problems.append(f"imports {', '.join(names)} (line {node.lineno})")
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "ctx":
            if node.attr not in SUPPORTED:
                problems.append(f"ctx.{node.attr} (line {node.lineno})")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                isinstance(node.func.value, ast.Name) and node.func.value.id == "ctx":
            if node.func.attr == "start_req" and any(k.arg == "input_ids" for k in node.keywords):
                problems.append(f"ctx.start_req(input_ids=...) (line {node.lineno}; use prompt_len/prompt_token)")
            if node.func.attr == "wait_for_window":
                arg = node.args[0] if node.args else None
                if not (isinstance(arg, ast.Constant) and arg.value in WINDOWS):
                    shown = arg.value if isinstance(arg, ast.Constant) else "a computed name"
                    problems.append(f"window {shown!r} (line {node.lineno}; exportable: {', '.join(sorted(WINDOWS))})")
    if not any(isinstance(n, ast.FunctionDef) and n.name == func for n in tree.body):
        problems.append(f"no top-level function {func!r}")
    return sorted(set(problems), key=problems.index)


def engine_kwargs(topology: str) -> Dict[str, Any]:
    """The topology's engine arguments, device-neutral (SGLang's CI picks the model)."""
    kwargs = engine_config.engine_kwargs("cpu", topology)
    return {k: v for k, v in sorted(kwargs.items()) if k not in DROPPED_ENGINE_ARGS}


def render(path: str, func: str, *, topology: str) -> str:
    """The exported test's source; an ``ExportError`` if it does not travel."""
    text = Path(path).read_text()
    tree = ast.parse(text, filename=path)
    problems = _problems(tree, func)
    if problems:
        raise ExportError(f"{path}:{func} uses what SGLang's harness has no equivalent for: "
                          + "; ".join(problems[:6]) + (" ..." if len(problems) > 6 else ""))
    body = re.sub(r"^from __future__ import annotations\n", "", text, flags=re.M)
    doc = ast.get_docstring(tree)
    if doc:  # the scenario's docstring becomes a comment block: the file's own docstring comes first
        first = tree.body[0]
        lines = body.splitlines(True)
        body = "".join(lines[first.end_lineno:]) if first.lineno == 1 else body
        body = "".join(f"# {line}".rstrip() + "\n" for line in doc.splitlines()) + body
    class_name = "Test" + "".join(part.capitalize() for part in func.split("_"))
    kwargs = engine_kwargs(topology)
    kw_lines = "".join(f"        {k}={v!r},\n" for k, v in kwargs.items())
    return f'''"""{func}, exported from scripted-runtime ({Path(path).name}:{func}, topology {topology}).

Runs on SGLang's own scripted-runtime harness (sglang.test.scripted_runtime,
0.5.13+): one ``yield`` of the scenario is one scheduler iteration. The
scenario is as written for scripted-runtime; the adapter below gives it
that harness's context API over SGLang's ScriptedContext. The test fails
where the scenario's own assertions (or a scheduler crash) fail it.
"""
from __future__ import annotations

import unittest

from sglang.test.scripted_runtime.test_case import ScriptedTestCase

MODEL_PATH = {MODEL_PLACEHOLDER!r}


# --- adapter: the scripted-runtime context API over SGLang's ScriptedContext ---
{export_adapter.source()}

# --- the scenario, as written for scripted-runtime ---
{body.strip()}


def run_{func}(ctx):
    """The scenario as a script of SGLang's harness."""
    yield from _adapted({func}, ctx)


class {class_name}(ScriptedTestCase):
    ENGINE_KWARGS = dict(
        model_path=MODEL_PATH,
{kw_lines}    )

    def test_{func}(self):
        self.server.execute_script(run_{func})


if __name__ == "__main__":
    unittest.main()
'''


def export(path: str, func: str, out: Path, *, topology: str) -> Path:
    source = render(path, func, topology=topology)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(source)
    return out
