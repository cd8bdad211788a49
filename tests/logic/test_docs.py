"""The documentation stays honest: every ``scripted-runtime`` command shown in
README.md and docs/ parses with the real CLI parser (its subcommand and
options exist, its scenario files and functions exist), every relative link
resolves, and the README's own tutorial scenario runs on the real scheduler."""
from __future__ import annotations

import contextlib
import io
import re
import shlex
import textwrap
from pathlib import Path
from typing import Iterator, List, Tuple

from scripted_runtime.errors import UsageError
from scripted_runtime.user_side import cli

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
# `scripted-runtime` as a command word: at a line's start, after a path
# (.venv/bin/), a space, a prompt or a backtick.
COMMAND = re.compile(r"(?:^|(?<=[\s/`]))scripted-runtime[ \t]+(?P<args>[^`\n]*)")
SHELL_END = re.compile(r"\s(?:\||&&|;|>|2>|<)\s?.*$")
FUNCTION_SPEC = re.compile(r"^(?P<path>[\w./-]+\.py):(?P<func>[\w.]+)$")
LINK = re.compile(r"\]\((?P<target>[^)\s]+)\)")


def _code_lines(text: str) -> Iterator[Tuple[int, str, bool]]:
    """(line number, line, inside a fenced block), with ``\\`` continuations joined."""
    fenced = False
    pending, start = "", 0
    for n, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if pending:
            line = line.strip()
        if fenced and line.rstrip().endswith("\\"):
            pending, start = pending + line.rstrip()[:-1].rstrip() + " ", start or n
            continue
        yield (start or n), pending + line, fenced
        pending, start = "", 0


def shown_commands(text: str) -> List[Tuple[int, str, bool]]:
    """Every scripted-runtime command in fenced blocks and inline code:
    (line, arguments, whether it was in a fenced block)."""
    found = []
    for n, line, fenced in _code_lines(text):
        spans = [line] if fenced else re.findall(r"`([^`]+)`", line)
        for span in spans:
            if fenced and span.lstrip().startswith("#"):
                continue
            for m in COMMAND.finditer(span):
                args = SHELL_END.sub("", m.group("args")).strip()
                found.append((n, args, fenced))
    return found


def _parse(args: str):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            return cli.build_parser().parse_args(shlex.split(args, comments=True)), ""
        except SystemExit:
            return None, err.getvalue().strip().splitlines()[-1]


def _scenario_specs(ns) -> List[str]:
    spec = getattr(ns, "scenario", None)
    return [spec] if isinstance(spec, str) else list(spec or [])


def _check_in_repo(spec: str) -> str:
    """A shown PATH.py:FUNCTION inside this repo must exist (files of the
    reader's own, like my_race.py or explore-found/..., are not checked)."""
    m = FUNCTION_SPEC.match(spec)
    if (not m or m["path"].startswith(("/", "explore-found/"))
            or not (ROOT / m["path"].split("/")[0]).is_dir()):
        return ""
    try:
        cli.check_script_spec(str(ROOT / m["path"]) + ":" + m["func"])
    except UsageError as exc:
        return str(exc)
    return ""


def test_docs_exist_and_are_linked_from_the_readme():
    readme = (ROOT / "README.md").read_text()
    pages = [p for p in DOCS if p.parent.name == "docs"]
    assert len(pages) >= 7, f"docs/ pages: {[p.name for p in pages]}"
    unlinked = [p.name for p in pages if f"docs/{p.name}" not in readme]
    assert not unlinked, f"docs pages the README does not link: {unlinked}"
    assert len(readme.splitlines()) <= 300, "README.md grew past 300 lines: move the detail into docs/"


def test_every_shown_command_parses_with_the_cli():
    problems, seen = [], 0
    for doc in DOCS:
        for line, args, fenced in shown_commands(doc.read_text()):
            seen += 1
            ns, error = _parse(args)
            where = f"{doc.relative_to(ROOT)}:{line}: scripted-runtime {args}"
            if ns is None and not fenced and "arguments are required" in error:
                continue  # prose naming a subcommand (`scripted-runtime ab`) need not show its arguments
            if ns is None:
                problems.append(f"{where}\n    {error}")
                continue
            for spec in _scenario_specs(ns):
                missing = _check_in_repo(spec)
                if missing:
                    problems.append(f"{where}\n    {missing}")
    assert seen >= 20, f"only {seen} commands found: is the extraction broken?"
    assert not problems, "commands shown in the docs that the CLI rejects:\n" + "\n".join(problems)


def test_extraction_and_parsing_catch_a_wrong_command():
    text = textwrap.dedent("""
        ```bash
        $ .venv/bin/scripted-runtime run scenarios/demo.py:chunked_then_decode --pp 4 | tail
        .venv/bin/scripted-runtime explore --pp 4 \\
            --profile nightly-ish
        git bisect run /x/.venv/bin/scripted-runtime bisect-check s.py:f --sglang "$PWD"
        ```
        Run `scripted-runtime trace show FILE --last 5` or `scripted-runtime rnu x.py:f`.
        """)
    cmds = shown_commands(text)
    assert [a for _, a, _ in cmds] == [
        "run scenarios/demo.py:chunked_then_decode --pp 4",
        "explore --pp 4 --profile nightly-ish",
        'bisect-check s.py:f --sglang "$PWD"',
        "trace show FILE --last 5",
        "rnu x.py:f",
    ]
    assert [fenced for _, _, fenced in cmds] == [True, True, True, False, False]
    verdicts = [_parse(a)[1] for _, a, _ in cmds]
    assert verdicts[0] == verdicts[2] == verdicts[3] == ""
    assert "invalid choice: 'nightly-ish'" in verdicts[1]
    assert "invalid choice: 'rnu'" in verdicts[4]
    assert "has no function 'nope'" in _check_in_repo("scenarios/demo.py:nope")
    assert _check_in_repo("my_race.py:two_requests") == ""


def test_relative_links_resolve():
    broken = []
    for doc in DOCS:
        for n, line in enumerate(doc.read_text().splitlines(), 1):
            for m in LINK.finditer(line):
                target = m["target"].split("#")[0]
                if not target or re.match(r"^[a-z]+:", target):
                    continue
                if not (doc.parent / target).exists():
                    broken.append(f"{doc.relative_to(ROOT)}:{n}: {m['target']}")
    assert not broken, "links to files that do not exist:\n" + "\n".join(broken)


def test_the_context_api_reference_is_complete():
    """Every public member of the script context, the request handle and
    ControlOp has its line in docs/writing-scenarios.md's reference."""
    from scripted_runtime.scheduler_side.context.api import ScriptContext
    from scripted_runtime.scheduler_side.context.requests import ReqHandle
    from scripted_runtime.scheduler_side.control import ControlOp

    text = (ROOT / "docs" / "writing-scenarios.md").read_text()
    reference = text[text.index("## Context API reference"):]
    # the class and the mixins it is made of (context/runtime_ops.py, context/tensor_updates.py)
    ctx_members = {n for klass in ScriptContext.__mro__[:-1] for n in vars(klass) if not n.startswith("_")}
    # attributes set in __init__ (ctx.scheduler, ctx.control_listeners, ...)
    ctx_members |= set(re.findall(r"self\.([a-z]\w*) *(?::[^=]+)?=", (ROOT / "scripted_runtime" / "scheduler_side"
                                                                        / "context" / "api.py").read_text()))
    missing = sorted(n for n in ctx_members if f"ctx.{n}" not in reference)
    assert not missing, f"ctx members without a line in the reference: {missing}"
    for cls in (ReqHandle, ControlOp):
        members = {n for n in vars(cls) if not n.startswith("_")} | set(getattr(cls, "__annotations__", {}))
        missing = sorted(n for n in members if f"`{n}`" not in reference and f"`{n}(" not in reference)
        assert not missing, f"{cls.__name__} members without a line in the reference: {missing}"


# ---------------------------------------------------------------------------
# Citations: nothing in the repository points outside it, and every test file
# it names exists. The reader's own files that docs show by name (the output
# of `export -o`, a test in "your own repository", a foreign project's test)
# are not this repository's and are listed here.
READERS_OWN_TEST_FILES = {"test_my_race.py", "test_chunked_row_reuse.py", "test_foreign.py"}
SCANNED_SUFFIXES = {".md", ".py", ".sh", ".toml", ".txt", ".json", ".jsonl", ".cfg", ".ini", ".yml", ".yaml"}
SKIPPED_DIRS = {".git", ".venv", "__pycache__", ".pytest_cache", ".hypothesis", "build", "dist",
                "explore-found", ".scripted-runtime", "runs"}
# `../x` as a path (not the tail of `.../x`), and a path naming a test file:
# under tests/, or a basename test_*.py.
PARENT_PATH = re.compile(r"(?<![\w.])(?:\.\./)+[\w.\-/]*")
PY_PATH = re.compile(r"(?<![\w./-])[\w./-]*\.py\b")
# Absolute paths of the machine the project was written on (its checkout's parent
# is added per root), never valid in a file that travels with the repository.
OUTSIDE_PREFIXES = ("/" + "work/",)


def _repo_text_files(root: Path) -> List[Path]:
    """Every text file of the repository except its VCS, virtual environment and build outputs."""
    files = []
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if any(part in SKIPPED_DIRS or part.endswith(".egg-info") for part in rel.parts[:-1]):
            continue
        if path.is_file() and (path.suffix in SCANNED_SUFFIXES or rel.parts[0] in {"ci", ".ci"}):
            files.append(path)
    return files


def citation_offences(root: Path, path: Path, text: str) -> List[str]:
    """file:line: what, for each path outside ``root`` and each named test file that does not exist."""
    rel = path.relative_to(root)
    test_names = {p.name for p in (root / "tests").rglob("test_*.py")}
    prefixes = [p for p in {*OUTSIDE_PREFIXES, str(root.resolve().parent).rstrip("/") + "/"} if p != "/"]
    found = []
    for n, line in enumerate(text.splitlines(), 1):
        where = f"{rel}:{n}"
        outside = sorted(p for p in prefixes if p in line)
        if outside:
            found.append(f"{where}: absolute path outside the repository ({outside[0]}...)")
        for m in PARENT_PATH.finditer(line):
            cited = m.group(0)
            target = (path.parent / cited).resolve()
            if cited.startswith("../shared") or not target.is_relative_to(root.resolve()):
                found.append(f"{where}: path outside the repository: {cited}")
        for m in PY_PATH.finditer(line):
            cited = m.group(0).rstrip(".")
            name = cited.rsplit("/", 1)[-1]
            if cited.startswith(("/", ".")) or name in READERS_OWN_TEST_FILES:
                continue
            if cited.startswith("tests/"):
                if not (root / cited).is_file():
                    found.append(f"{where}: test file that does not exist: {cited}")
            elif name.startswith("test_") and "/" not in cited:
                if name not in test_names and not (path.parent / name).is_file():
                    found.append(f"{where}: test file that does not exist: {cited}")
    return found


def test_nothing_cites_a_path_outside_the_repository_or_a_missing_test_file():
    this_file = Path(__file__).resolve()  # its fixtures below spell the offences out
    files = [p for p in _repo_text_files(ROOT) if p.resolve() != this_file]
    assert len(files) > 100, f"only {len(files)} files scanned: is the walk broken?"
    offences = [o for p in files for o in citation_offences(ROOT, p, p.read_text(errors="replace"))]
    assert not offences, ("citations of paths outside the repository or of missing test files:\n"
                          + "\n".join(offences))


def test_citation_check_catches_each_kind_of_offence(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_real.py").write_text("")
    (tmp_path / "docs").mkdir()
    doc = tmp_path / "docs" / "page.md"
    text = textwrap.dedent("""\
        fine: [x](../README.md), tests/test_real.py, test_real.py, .../tail/x.py, test_my_race.py
        notes in ../shared/DESIGN.md
        a link [y](../../elsewhere.md)
        an absolute /work/main/tests/test_real.py
        see tests/test_gone.py and test_gone_too.py
        """)
    found = citation_offences(tmp_path, doc, text)
    assert found == [
        "docs/page.md:2: path outside the repository: ../shared/DESIGN.md",
        "docs/page.md:3: path outside the repository: ../../elsewhere.md",
        "docs/page.md:4: absolute path outside the repository (/work/...)",
        "docs/page.md:5: test file that does not exist: tests/test_gone.py",
        "docs/page.md:5: test file that does not exist: test_gone_too.py",
    ], found
    # A comment in a module one level down citing ../shared is caught even though
    # <root>/shared would be inside the tree.
    code = tmp_path / "hooks" / "x.py"
    code.parent.mkdir()
    assert citation_offences(tmp_path, code, "# see ../shared/DESIGN.md\n") == [
        "hooks/x.py:1: path outside the repository: ../shared/DESIGN.md"]


# `docs/PAGE.md, "Section"` (also wrapped across lines, in a comment or docstring)
SECTION_CITE = re.compile(r'(docs/[\w-]+\.md)`{0,2},\s*(?:#\s*)?"([^"\n]+)"')


def cited_section_offences(root: Path, path: Path, text: str) -> List[str]:
    """file:line: what, for each `docs/PAGE.md, "Section"` whose page has no such heading."""
    found = []
    for m in SECTION_CITE.finditer(text):
        page, section = root / m.group(1), m.group(2)
        headings = ({h.strip().strip("`") for h in re.findall(r"^#+ (.+)$", page.read_text(), re.M)}
                    if page.is_file() else set())
        if section not in headings:
            line = text.count("\n", 0, m.start()) + 1
            found.append(f"{path.relative_to(root)}:{line}: {m.group(1)} has no section \"{section}\"")
    return found


def test_cited_doc_sections_exist():
    this_file = Path(__file__).resolve()  # its fixtures spell out citations of sections that do not exist
    offences = [o for p in _repo_text_files(ROOT) if p.resolve() != this_file
                for o in cited_section_offences(ROOT, p, p.read_text(errors="replace"))]
    assert not offences, "citations of doc sections that do not exist:\n" + "\n".join(offences)


def test_cited_section_check_catches_a_missing_section(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text("# Page\n\n## Running on CPU\n")
    code = tmp_path / "x.py"
    text = '"""Measured (docs/page.md,\n"Running on CPU"); see ``docs/page.md``, "Running on GPU"."""\n'
    assert cited_section_offences(tmp_path, code, text) == ['x.py:2: docs/page.md has no section "Running on GPU"']
