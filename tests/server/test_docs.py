"""The README's own tutorial scenario runs on the real scheduler, on every
topology. The rest of the documentation checks: tests/logic/test_docs.py."""
from __future__ import annotations

import re
from pathlib import Path

from tests.helpers import run_ok

ROOT = Path(__file__).resolve().parents[2]
TUTORIAL_FUNCTION = "two_requests"


def tutorial_source() -> str:
    """The README's two-request scenario, as a newcomer would paste it."""
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    hits = [b for b in blocks if f"def {TUTORIAL_FUNCTION}(ctx" in b]
    assert len(hits) == 1, f"README.md should show one python block defining {TUTORIAL_FUNCTION}(ctx)"
    return hits[0]


def test_the_readme_tutorial_scenario_runs(server, tmp_path):
    path = tmp_path / "my_race.py"
    path.write_text(tutorial_source())
    result = run_ok(server, f"{path}:{TUTORIAL_FUNCTION}", timeout=120)
    assert result.steps > 0
