"""The wheel's package list matches the tree (pure logic): every package
under scripted_runtime/ and hooks/ is listed in pyproject.toml's
[tool.setuptools] packages, hooks/ installs as scripted_runtime.hooks, and
the data files read at run time (model configs, the sitecustomize every
SGLang process loads) exist where package-data says."""
from __future__ import annotations

from pathlib import Path
from typing import Dict, Set

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[2]


def _setuptools() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def packages_in_tree(root: Path, package_dir: Dict[str, str]) -> Set[str]:
    """Dotted names of every folder holding an __init__.py, under scripted_runtime/
    and under each folder package-dir maps to a package name."""
    roots = {"scripted_runtime": root / "scripted_runtime"}
    roots.update({name: root / folder for name, folder in package_dir.items()})
    found = set()
    for name, folder in roots.items():
        for init in folder.rglob("__init__.py"):
            rel = init.parent.relative_to(folder)
            if "__pycache__" in rel.parts:
                continue
            found.add(".".join([name, *rel.parts]))
    return found


def test_the_package_list_matches_the_tree():
    config = _setuptools()
    package_dir = config.get("package-dir", {})
    assert package_dir == {"scripted_runtime.hooks": "hooks"}, package_dir
    listed = set(config["packages"])
    in_tree = packages_in_tree(ROOT, package_dir)
    assert in_tree - listed == set(), f"packages missing from pyproject.toml: {sorted(in_tree - listed)}"
    assert listed - in_tree == set(), f"listed packages with no folder: {sorted(listed - in_tree)}"
    assert all(name.split(".")[0] == "scripted_runtime" for name in listed), listed


def test_package_data_exists():
    config = _setuptools()
    package_dir = config.get("package-dir", {})
    for package, patterns in config["package-data"].items():
        folder = ROOT / package_dir.get(package, package.replace(".", "/"))
        for pattern in patterns:
            assert list(folder.glob(pattern)), f"{package}: nothing matches {pattern} in {folder.relative_to(ROOT)}"


def test_packages_in_tree_finds_a_new_unlisted_package(tmp_path):
    (tmp_path / "scripted_runtime" / "new_side").mkdir(parents=True)
    (tmp_path / "scripted_runtime" / "__init__.py").write_text("")
    (tmp_path / "scripted_runtime" / "new_side" / "__init__.py").write_text("")
    (tmp_path / "hooks" / "extra").mkdir(parents=True)
    (tmp_path / "hooks" / "__init__.py").write_text("")
    (tmp_path / "hooks" / "extra" / "__init__.py").write_text("")
    (tmp_path / "hooks" / "_site").mkdir()  # data, no __init__.py: not a package
    assert packages_in_tree(tmp_path, {"scripted_runtime.hooks": "hooks"}) == {
        "scripted_runtime", "scripted_runtime.new_side", "scripted_runtime.hooks", "scripted_runtime.hooks.extra"}
