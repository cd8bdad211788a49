#!/usr/bin/env bash
# Install the harness and the SGLang release CI pins into ./.venv (idempotent).
#   bash ci/install.sh            # SGLang from ci/sglang-version.txt
#   SGLANG_SPEC='sglang==0.5.22' bash ci/install.sh
set -euo pipefail
cd "$(dirname "$0")/.."
SGLANG_SPEC="${SGLANG_SPEC:-sglang==$(tr -d '[:space:]' < ci/sglang-version.txt)}"
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  echo "[install] creating .venv with $($PY --version)"
  "$PY" -m venv .venv
fi
# The shared failure database's test starts a real redis-server on 127.0.0.1.
if ! command -v redis-server >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "[install] installing redis-server with apt-get (the shared failure database's test)"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server; } >/dev/null 2>&1 \
      || echo "[install] could not install redis-server: tests/logic/test_failure_db.py's Redis test will be skipped"
  else
    echo "[install] redis-server is missing and apt-get cannot run as root here: the Redis test will be skipped"
  fi
fi
if .venv/bin/python - "$SGLANG_SPEC" <<'PYEOF' 2>/dev/null
import importlib.metadata as m, sys
spec = sys.argv[1]
want = spec.split("==", 1)[1] if "==" in spec else None
have = m.version("sglang")
m.version("scripted-runtime"); m.version("pytest-xdist"); m.version("hypothesis"); m.version("redis")
# The console script must point where pyproject.toml says (a checkout whose
# modules moved keeps a stale entry point otherwise).
try:
    import tomllib
    with open("pyproject.toml", "rb") as f:
        wanted_ep = tomllib.load(f)["project"]["scripts"]["scripted-runtime"]
    have_ep = [e.value for e in m.entry_points(group="console_scripts") if e.name == "scripted-runtime"]
    if have_ep != [wanted_ep]:
        sys.exit(1)
    plugin = [e.value for e in m.entry_points(group="pytest11") if e.name == "scripted_runtime"]
    if plugin != ["scripted_runtime.pytest_plugin"]:
        sys.exit(1)
except ImportError:  # Python 3.10: no tomllib; the version checks above suffice
    pass
sys.exit(0 if want is None or have == want else 1)
PYEOF
then
  echo "[install] .venv already has $SGLANG_SPEC and the harness"
  exit 0
fi
echo "[install] installing $SGLANG_SPEC and the harness into .venv (first time: ~5 min, ~11 GB)"
.venv/bin/python -m pip install --progress-bar off -q --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -m pip install --progress-bar off -q -e ".[test]" "$SGLANG_SPEC" 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -c "import sglang, scripted_runtime; print('[install] ok: sglang', sglang.__version__)"
