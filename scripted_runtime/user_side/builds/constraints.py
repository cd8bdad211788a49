"""Per-release install constraints for cached SGLang environments.

Old releases installed today drift: they leave some dependencies unpinned and
today's versions of those break them at import. Each entry says which
releases it applies to, what it pins, and what breaks without it (measured on
the CPU box; docs/sglang-facts.md, "Older releases").
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Tuple

from scripted_runtime.hooks.sglang_compat import parse_version


@dataclass(frozen=True)
class ReleaseConstraint:
    first: Tuple[int, ...]  # inclusive
    last: Tuple[int, ...]  # inclusive
    requirement: str
    why: str

    def applies(self, version: str) -> bool:
        return self.first <= parse_version(version) <= self.last


CONSTRAINTS = (
    ReleaseConstraint(
        (0, 5, 10, 0), (0, 5, 13, 0), "kernels>=0.14.1,<0.15",
        "the release leaves `kernels` unpinned; kernels 0.17.x breaks its transformers 5.x at "
        "import ('Either a revision or a version must be specified')"),
    # Not for 0.5.9 and older: they pin transformers 4.57.1 (huggingface-hub<1.0), which
    # kernels 0.14.x (huggingface-hub>=1.10) cannot be installed beside (measured: pip's
    # ResolutionImpossible for sglang==0.5.9).
)


def for_requirement(requirement: str) -> List[ReleaseConstraint]:
    """Constraints for a pinned ``sglang==X`` requirement (none when unpinned)."""
    _, sep, version = requirement.partition("==")
    if not sep:
        return []
    return [c for c in CONSTRAINTS if c.applies(version.strip())]
