"""Running SGLang's own scripted-runtime harness (``sglang.test.scripted_runtime``)
on this CPU box (harness process): the environment and engine arguments its
servers need here (``bench/compare_child.py`` times it with them), and the
command that runs an exported test with them::

    python -m scripted_runtime.user_side.upstream_run EXPORTED.py --topology pp1-normal [--revert-fix pr17850]

Exit 0 when the exported test passed, 1 when it failed, 2 on a usage error.
The CPU enablement comes from ``hooks/`` (its sitecustomize on PYTHONPATH,
so SGLang's spawned server processes get it too), without our scheduler
hook; ``--revert-fix`` undoes a fix in every rank, as everywhere else.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import unittest
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional

from scripted_runtime.hooks import fix_toggles, sglang_compat
from scripted_runtime import module_paths, protocol
from scripted_runtime.user_side import engine_config
from scripted_runtime.user_side.models import files as model_files



def cpu_engine_kwargs(topology: str) -> Dict[str, Any]:
    """The topology's engine arguments on this box, with the local tiny model."""
    kwargs = engine_config.engine_kwargs("cpu", topology)
    name = engine_config.DEVICE_MODELS["cpu"]
    served, _ = model_files.served_and_update_checkpoints(name, str(kwargs.get("load_format", "auto")))
    kwargs["model_path"] = str(served or model_files.model_dir(name))
    return kwargs


def server_env(kwargs: Dict[str, Any], *, upstream: bool = False, paths: Iterable[str] = (),
               revert_fixes: Iterable[str] = ()) -> Dict[str, str]:
    """The environment of an SGLang server without our scheduler hook: CPU
    enablement from hooks/ (sitecustomize), the harness's server env, the
    OMP binding rule of the release; ``upstream``: SGLang's own harness."""
    env = {**sglang_compat.SERVER_ENV, **os.environ}
    env.update({
        protocol.ENV_HOOKS: "1",
        protocol.ENV_DEVICE: "cpu",
        "SCRIPTED_RUNTIME_SCHEDULER_HOOK": "0",
        "PYTHONPATH": os.pathsep.join([str(module_paths.site_dir()), module_paths.harness_path_entry(), *paths]),
        "PYTHONUNBUFFERED": "1",
        "SGLANG_CPU_OMP_THREADS_BIND": sglang_compat.omp_bind_rule().value(
            tp_size=kwargs.get("tp_size", 1), pp_size=kwargs.get("pp_size", 1), cores=os.cpu_count() or 1),
        fix_toggles.ENV_REVERT_FIXES: ",".join(revert_fixes),
        "SGLANG_TEST_MAX_RETRY": "0",  # CustomTestCase retries a failed test in CI: one run says it all
    })
    if upstream:
        env["SCRIPTED_RUNTIME_UPSTREAM_HARNESS"] = "1"
    return env


def upstream_cpu_kwargs(kwargs: Dict[str, Any]) -> Dict[str, Any]:
    """What SGLang's ``ScriptedHttpServer`` needs on CPU on top of ``kwargs``."""
    from sglang.srt.server_args import ServerArgs

    out = dict(kwargs)
    out.update(sglang_compat.cpu_server_args(ServerArgs, out))
    out.update(sglang_compat.UPSTREAM_HARNESS_CPU_ARGS)
    return out


def run_exported(path: str, *, topology: str, revert_fixes: Iterable[str] = ()) -> int:
    """In this process: run the ``ScriptedTestCase`` classes of an exported
    test on CPU (their ``ENGINE_KWARGS`` completed with this box's CPU
    arguments and model). Returns 0 if they passed."""
    path = os.path.abspath(path)
    kwargs = cpu_engine_kwargs(topology)
    os.environ.update(server_env(kwargs, upstream=True, paths=[os.path.dirname(path)],
                                 revert_fixes=revert_fixes))
    sys.path.insert(0, os.path.dirname(path))  # SGLang's spawned processes import the script by module name
    from scripted_runtime import hooks

    hooks.activate()
    name = Path(path).stem
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    from sglang.test.scripted_runtime.test_case import ScriptedTestCase

    cases = [obj for obj in vars(module).values()
             if isinstance(obj, type) and issubclass(obj, ScriptedTestCase) and obj is not ScriptedTestCase]
    if not cases:
        print(f"{path}: no ScriptedTestCase subclass", file=sys.stderr)
        return 2
    for case in cases:
        case.ENGINE_KWARGS = upstream_cpu_kwargs({**kwargs, **{k: v for k, v in case.ENGINE_KWARGS.items()
                                                               if k != "model_path"}})
    suite = unittest.TestSuite(unittest.defaultTestLoader.loadTestsFromTestCase(c) for c in cases)
    result = unittest.TextTestRunner(stream=sys.stdout, verbosity=2).run(suite)
    return 0 if result.wasSuccessful() else 1


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripted_runtime.user_side.upstream_run",
                                     description="run an exported test under SGLang's own harness on CPU")
    parser.add_argument("file")
    parser.add_argument("--topology", default="pp1-overlap", choices=sorted(engine_config.TOPOLOGIES))
    parser.add_argument("--revert-fix", action="append", default=[], metavar="NAME")
    args = parser.parse_args(argv)
    try:
        fix_toggles.validate(args.revert_fix)
    except ValueError as exc:
        print(f"upstream_run: {exc}", file=sys.stderr)
        return 2
    if not os.path.isfile(args.file):
        print(f"upstream_run: no such file: {args.file}", file=sys.stderr)
        return 2
    return run_exported(args.file, topology=args.topology, revert_fixes=args.revert_fix)


if __name__ == "__main__":
    sys.exit(main())
