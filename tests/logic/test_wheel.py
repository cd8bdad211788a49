"""The package as users install it (the wheel and its fresh environment:
tests/wheel_env.py): what the wheel holds, and that it imports and finds its
run-time files from outside the checkout (seconds). On real servers (slow
lane: the demo, a short exploration, a foreign project's pytest file):
tests/server/test_wheel.py."""
from __future__ import annotations

import textwrap
import zipfile
from pathlib import Path

from tests.wheel_env import ROOT, env_for, outside, run


def test_the_wheel_installs_only_scripted_runtime_and_carries_its_run_time_files(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names}
    assert top == {"scripted_runtime", wheel.name.split("-")[0] + "-" + wheel.name.split("-")[1] + ".dist-info"}, top
    for needed in ("scripted_runtime/hooks/__init__.py", "scripted_runtime/hooks/scheduler_hook.py",
                   "scripted_runtime/hooks/_site/sitecustomize.py",
                   "scripted_runtime/user_side/models/tiny-qwen2.json",
                   "scripted_runtime/user_side/models/qwen2.5-0.5b.json"):
        assert needed in names, f"{needed} missing from {wheel.name}"
    sources = [f"scripted_runtime/{p.relative_to(ROOT / 'scripted_runtime').as_posix()}"
               for p in (ROOT / "scripted_runtime").rglob("*.py")]
    sources += [f"scripted_runtime/hooks/{p.relative_to(ROOT / 'hooks').as_posix()}" for p in (ROOT / "hooks").rglob("*.py")]
    missing = sorted(set(sources) - set(names))
    assert not missing, f"modules left out of the wheel (pyproject.toml's packages list): {missing}"
    entry_points = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "scripted-runtime = scripted_runtime.user_side.cli:main" in entry_points
    assert "scripted_runtime = scripted_runtime.pytest_plugin" in entry_points


def test_the_installed_wheel_imports_and_finds_its_files_outside_the_checkout(fresh_env, tmp_path):
    work = outside(tmp_path)
    probe = textwrap.dedent("""
        import json, scripted_runtime, scripted_runtime.hooks
        from scripted_runtime import module_paths
        from scripted_runtime.user_side.models import files
        print(json.dumps({
            "package": scripted_runtime.__file__,
            "hooks": scripted_runtime.hooks.__file__,
            "site": str(module_paths.site_dir()),
            "path_entry": module_paths.harness_path_entry(),
            "model": str(files.model_dir("tiny-qwen2")),
        }))
    """)
    import json

    out = json.loads(run([fresh_env / "bin" / "python", "-c", probe], cwd=work, env=env_for(fresh_env)).stdout)
    for key in ("package", "hooks", "site"):
        assert Path(out[key]).resolve().is_relative_to(fresh_env.resolve()), (key, out)
    assert (Path(out["site"]) / "sitecustomize.py").is_file()
    entry = Path(out["path_entry"])
    assert sorted(p.name for p in entry.iterdir()) == ["scripted_runtime"], "the ranks' PYTHONPATH entry holds only the package"
    assert (Path(out["model"]) / "config.json").is_file()
    help_text = run([fresh_env / "bin" / "scripted-runtime", "--help"], cwd=work, env=env_for(fresh_env)).stdout
    assert "explore" in help_text and "run" in help_text
    assert not list(work.iterdir()), "importing and --help wrote nothing in the working directory"
