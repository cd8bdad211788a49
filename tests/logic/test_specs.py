"""The one spec parser (``scripted_runtime/specs.py``): its forms, its
errors, loading, and that every output keyed by a spec stays under the
folder it is put in (``mutate --out``, whatever the spec's form). No SGLang
server."""
from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from scripted_runtime import extensions, specs
from scripted_runtime.errors import UsageError
from scripted_runtime.hooks import patches
from scripted_runtime.hooks.patch_base import Patch
from scripted_runtime.user_side import mutate
from scripted_runtime.user_side.builds import ab

MODULE_TEXT = '''
from scripted_runtime.hooks.patch_base import Patch

class Holder:
    def method(self):
        return "method"

planted = Patch(name="planted", summary="a planted bug", install=lambda module: None)

def NAME(module):
    """A bare function patch."""
'''


@pytest.fixture
def user_tree(tmp_path, monkeypatch):
    """tmp_path/abs/dir/my_mutants.py, and the package specpkg/mods.py
    importable from tmp_path; the current directory is tmp_path."""
    folder = tmp_path / "abs" / "dir"
    folder.mkdir(parents=True)
    (folder / "my_mutants.py").write_text(textwrap.dedent(MODULE_TEXT))
    pkg = tmp_path / "specpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "mods.py").write_text(textwrap.dedent(MODULE_TEXT))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    for name in [n for n in sys.modules if n == "specpkg" or n.startswith("specpkg.")]:
        del sys.modules[name]


def test_a_relative_path_is_a_file_made_absolute(user_tree):
    spec = specs.parse("abs/dir/my_mutants.py:NAME")
    assert (spec.kind, spec.where, spec.attr) == (specs.FILE, str(user_tree / "abs/dir/my_mutants.py"), "NAME")
    assert spec.given_where == "abs/dir/my_mutants.py"
    assert spec.canonical == f"{user_tree}/abs/dir/my_mutants.py:NAME"
    assert (spec.label, spec.short) == ("my_mutants.NAME", "my_mutants.py:NAME")
    assert spec.source_file() == spec.where and spec.search_root() is None


def test_an_absolute_path_keeps_its_path_and_its_label_has_no_directory():
    spec = specs.parse("/abs/dir/my_mutants.py:NAME")
    assert (spec.kind, spec.where, spec.attr) == (specs.FILE, "/abs/dir/my_mutants.py", "NAME")
    assert spec.label == "my_mutants.NAME" and "/" not in spec.label
    assert spec.source_file() is None  # no such file here: found, not raised


def test_a_module_spec_finds_its_file_and_search_root_without_importing(user_tree):
    spec = specs.parse("specpkg.mods:planted")
    assert (spec.kind, spec.where, spec.attr) == (specs.MODULE, "specpkg.mods", "planted")
    assert (spec.label, spec.short, spec.canonical) == ("specpkg.mods.planted", "specpkg.mods:planted",
                                                        "specpkg.mods:planted")
    assert spec.source_file() == str(user_tree / "specpkg" / "mods.py")
    assert Path(spec.search_root()) == user_tree
    assert "specpkg.mods" not in sys.modules
    assert specs.parse("no.such.module:fn").search_root() is None


def test_a_qualname_with_dots_loads_the_nested_attribute(user_tree):
    by_path = specs.parse("abs/dir/my_mutants.py:Holder.method")
    by_module = specs.parse("specpkg.mods:Holder.method")
    assert by_path.attr == by_module.attr == "Holder.method"
    assert by_path.label == "my_mutants.Holder.method"
    assert by_path.load().__qualname__ == by_module.load().__qualname__ == "Holder.method"


@pytest.mark.parametrize("where, is_file", [("x.py", True), ("dir/x", True), ("/abs/x", True), ("./x", True),
                                            ("x", False), ("pkg.mod", False)])
def test_one_rule_says_what_names_a_file(where, is_file):
    assert specs.names_a_file(where) is is_file
    assert specs.parse(f"{where}:fn").is_file is is_file
    assert specs.parse(where, attribute=False).is_file is is_file


def test_a_module_only_spec_has_no_attribute(user_tree):
    assert specs.parse("specpkg.mods", attribute=False).load().__name__ == "specpkg.mods"
    spec = specs.parse("abs/dir/my_mutants.py", attribute=False)
    assert (spec.attr, spec.label, spec.canonical) == ("", "my_mutants", str(user_tree / "abs/dir/my_mutants.py"))


@pytest.mark.parametrize("text, words", [
    ("", "expected PATH.py:NAME or MODULE:NAME"),
    ("justaname", "expected PATH.py:NAME or MODULE:NAME"),
    (":fn", "expected"),
    ("x.py:", "expected"),
    ("x.py:not a name", "'not a name' is not a Python name"),
    ("x.py:fn.", "'fn.' is not a Python name"),
    ("foo-bar:fn", "'foo-bar' is neither a path nor a dotted module name"),
])
def test_bad_forms_are_one_line_usage_errors_naming_the_spec(text, words):
    with pytest.raises(specs.SpecError) as info:
        specs.parse(text, what="scenario")
    message = str(info.value)
    assert message.startswith(f"scenario {text!r}: ") and words in message and "\n" not in message
    assert isinstance(info.value, UsageError) and isinstance(info.value, ValueError)


def test_patches_check_and_load_agree_on_a_path_without_py(user_tree):
    """``dir/file:ATTR`` is a path for both (before, ``check`` read it as a
    file and ``load`` imported it as a module)."""
    (user_tree / "abs" / "dir" / "noext").write_text(textwrap.dedent(MODULE_TEXT))
    resolved = patches.check("abs/dir/noext:planted")
    assert resolved.spec == f"{user_tree}/abs/dir/noext:planted" and resolved.search_path is None
    assert isinstance(patches.load(resolved.spec), Patch)


def test_patch_labels_never_hold_a_directory():
    assert patches.label("mut_abort_keeps_row") == "mut_abort_keeps_row"
    assert patches.label("/abs/dir/my_mutants.py:NAME") == "my_mutants.NAME"
    assert patches.label("../up/my_mutants.py:NAME") == "my_mutants.NAME"
    assert patches.label("specpkg.mods:planted") == "specpkg.mods.planted"


@pytest.mark.parametrize("mutant, leaf", [
    ("/abs/dir/my_mutants.py:NAME", "my_mutants.NAME"),
    ("abs/dir/my_mutants.py:NAME", "my_mutants.NAME"),
    ("../my_mutants.py:NAME", "my_mutants.NAME"),
    ("specpkg.mods:planted", "specpkg.mods.planted"),
    ("mut_abort_keeps_row", "mut_abort_keeps_row"),
    (mutate.BASELINE, "unmutated"),
])
def test_mutate_writes_each_row_under_out(tmp_path, mutant, leaf):
    out = tmp_path / "found"
    got = mutate.out_dir_for(out, "pp1-overlap", mutant)
    assert got == out / "pp1-overlap" / leaf
    assert os.path.commonpath([got.resolve(), out.resolve()]) == str(out.resolve())


def test_run_table_gives_an_absolute_path_patch_a_folder_under_out(user_tree):
    """The reported bug: ``--patch /abs/dir/my_mutants.py:NAME --out found``
    wrote beside the user's file (``/abs/dir/my_mutants.py_NAME``)."""
    absolute = f"{user_tree}/abs/dir/my_mutants.py:NAME"
    seen = []

    def explore(config, settings, *, out_dir, **kw):
        seen.append((tuple(config.patches), out_dir))
        return SimpleNamespace(failed=False, signature=None, stats=SimpleNamespace(examples=1))

    mutate.run_table(topologies=["pp1-overlap"], mutants=[absolute], out_dir=Path("found"),
                     explore_fn=explore, progress=lambda line: None)
    assert seen == [((), Path("found/pp1-overlap/unmutated")),
                    ((absolute,), Path("found/pp1-overlap/my_mutants.NAME"))]
    assert not (user_tree / "abs" / "dir" / "my_mutants.py_NAME").exists()


def test_extensions_resolve_through_the_same_rule(user_tree):
    assert extensions.resolve("abs/dir/my_mutants.py") == (str(user_tree / "abs/dir/my_mutants.py"), None)
    spec, root = extensions.resolve("specpkg.mods")
    assert spec == "specpkg.mods" and Path(root) == user_tree
    with pytest.raises(extensions.ExtensionError, match="neither a path nor a dotted module name"):
        extensions.resolve("foo-bar")


def test_ab_shortens_file_specs_only():
    assert ab.short_scenario("/abs/scenarios/x.py:fn") == "x.py:fn"
    assert ab.short_scenario("pkg.mod:fn") == "pkg.mod:fn"
