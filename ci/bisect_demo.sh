#!/usr/bin/env bash
# A full `git bisect run` session with bisect-check, reproducible offline.
#
# No SGLang git checkout is reachable from the CI boxes, so this builds a small
# synthetic history from the installed SGLang wheel (its python/sglang tree):
#   c0 good   the wheel as installed (tagged v<version>)
#   c1 BAD    PR 27446 undone in scheduler.py (the idle gate ignores mbs again)
#   c2        a tree that cannot start (syntax error in io_struct.py)
#   c3, c4    unrelated edits
# and bisects c0..c4 with the PR 27446 scenario on pp=4. bisect-check exits 0
# (good), 1 (bad) or 125 (skip: the build cannot start), so git skips c2 and
# names c1.
#   bash ci/bisect_demo.sh [WORKDIR]     (~5 min: one pp=4 server start per step)
set -euo pipefail
HARNESS="$(cd "$(dirname "$0")/.." && pwd)"
bash "$HARNESS/ci/install.sh" >/dev/null
WORK="${1:-$(mktemp -d /tmp/sglang-bisect-XXXX)}"
SITE="$("$HARNESS/.venv/bin/python" -c 'import sglang, os; print(os.path.dirname(sglang.__file__))' 2>/dev/null | tail -1)"
VERSION="$("$HARNESS/.venv/bin/python" -c 'import importlib.metadata as m; print(m.version("sglang"))')"
REPO="$WORK/sglang"
echo "[bisect-demo] building a synthetic SGLang history in $REPO from $SITE ($VERSION)"
rm -rf "$REPO" && mkdir -p "$REPO/python"
cp -r "$SITE" "$REPO/python/sglang"
find "$REPO" -name __pycache__ -prune -exec rm -rf {} +
cd "$REPO"
git init -q && git config user.email demo@example.com && git config user.name demo
commit() { git add -A && git commit -qm "$1" && git rev-parse --short HEAD; }
C0=$(commit "v$VERSION as released") && git tag "v$VERSION"
python3 - python/sglang/srt/managers/scheduler.py <<'PYEOF'
import sys
path = sys.argv[1]
src = open(path).read()
fixed = """        return all(x.is_empty() for x in self.running_mbs) and all(
            mb is None or mb.is_empty() for mb in self.mbs
        )"""
assert fixed in src, "PR 27446 check not found in scheduler.py"
open(path, "w").write(src.replace(fixed, "        return all(x.is_empty() for x in self.running_mbs)"))
PYEOF
C1=$(commit "refactor: simplify _pp_microbatches_drained (re-introduces the PR 27446 bug)")
echo "def broken(:" >> python/sglang/srt/managers/io_struct.py
C2=$(commit "WIP: io_struct edit that does not parse (cannot start)")
sed -i '$ d' python/sglang/srt/managers/io_struct.py
echo "# harmless comment" >> python/sglang/srt/managers/io_struct.py
C3=$(commit "fix the WIP edit")
echo "# docs tweak" >> python/sglang/srt/managers/io_struct.py
C4=$(commit "harmless: another comment")
echo "[bisect-demo] history: good $C0, bad $C1, unstartable $C2, $C3, $C4"
git bisect start "$C4" "$C0"
git bisect run "$HARNESS/.venv/bin/scripted-runtime" bisect-check \
  "$HARNESS/scenarios/pp_flush_inflight.py:flush_with_chunk_in_flight" --sglang "$REPO" --pp 4
git bisect log | tail -n 12
FIRST_BAD=$(git rev-parse --short refs/bisect/bad)
git bisect reset >/dev/null
if [ "$FIRST_BAD" = "$C1" ]; then
  echo "[bisect-demo] OK: bisect named $C1, the commit that undid PR 27446"
else
  echo "[bisect-demo] FAILED: bisect named $FIRST_BAD, expected $C1"; exit 1
fi
