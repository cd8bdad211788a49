"""What a build SPEC on the command line means (``ab --a SPEC``, ``bisect-check --sglang SPEC``).

    current                     the environment the harness runs in
    sglang==0.5.12.post1        a pip requirement: a cached environment built once for it
    /src/sglang[/python]        an SGLang source tree, imported over the base environment
    /src/sglang@v0.5.13         a git repository and revision: checked out into a throwaway
                                worktree, then used as a source tree

Any of them may end in ``+revert=NAME[,NAME]``: the same build with those
fixes undone in-process (``hooks/fix_toggles.py``), e.g. ``current+revert=pr27446``.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional, Tuple

REVERT_MARK = "+revert="
_REQUIREMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9_,.-]+\])?\s*(==|>=|<=|~=|!=|<|>|@)")


class SpecError(ValueError):
    pass


@dataclass(frozen=True)
class BuildSpec:
    text: str
    kind: str  # "current" | "pip" | "source" | "git"
    requirement: Optional[str] = None  # pip
    source: Optional[Path] = None  # source: the directory holding the sglang package
    repo: Optional[Path] = None  # git
    rev: Optional[str] = None  # git
    revert: Tuple[str, ...] = field(default_factory=tuple)

    @property
    def label(self) -> str:
        return self.text


def find_package_dir(path: Path) -> Optional[Path]:
    """The directory to put on sys.path for an SGLang tree given as the repo
    root or its ``python/`` folder (the one holding ``sglang/__init__.py``)."""
    for candidate in (path, path / "python"):
        if (candidate / "sglang" / "__init__.py").is_file():
            return candidate
    return None


def _split_revert(text: str) -> Tuple[str, Tuple[str, ...]]:
    base, sep, names = text.partition(REVERT_MARK)
    if not sep:
        return text, ()
    reverted = tuple(n.strip() for n in names.split(",") if n.strip())
    if not reverted:
        raise SpecError(f"{text!r}: '{REVERT_MARK}' needs fix names, e.g. current+revert=pr27446")
    return base, reverted


def parse(text: str) -> BuildSpec:
    base, revert = _split_revert(text.strip())
    if revert:
        from scripted_runtime.hooks import fix_toggles

        fix_toggles.validate(list(revert))
    if base == "current":
        return BuildSpec(text, "current", revert=revert)
    head, at, rev = base.rpartition("@")
    if at and head and os.path.isdir(head):
        repo = Path(head).resolve()
        if not (repo / ".git").exists():
            raise SpecError(f"{text!r}: {head} is not a git repository (REPO@REV needs one)")
        if not rev:
            raise SpecError(f"{text!r}: no revision after '@'")
        return BuildSpec(text, "git", repo=repo, rev=rev, revert=revert)
    if os.path.isdir(base):
        pkg = find_package_dir(Path(base).resolve())
        if pkg is None:
            raise SpecError(f"{text!r}: no sglang/__init__.py under {base} or {base}/python; "
                            "give an SGLang checkout or its python/ folder")
        return BuildSpec(text, "source", source=pkg, revert=revert)
    if _REQUIREMENT.match(base):
        if not base.lower().startswith("sglang"):
            raise SpecError(f"{text!r}: a pip requirement side must install sglang (e.g. sglang==0.5.13)")
        return BuildSpec(text, "pip", requirement=base, revert=revert)
    raise SpecError(
        f"{text!r} is not a build SPEC: use 'current', a pip requirement (sglang==0.5.13), "
        "an SGLang source tree (a directory), or REPO@REV (a git checkout and a revision); "
        f"add {REVERT_MARK}NAME to undo a fix in-process")


def parse_all(texts: List[str]) -> List[BuildSpec]:
    return [parse(t) for t in texts]
