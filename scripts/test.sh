#!/usr/bin/env bash
# Install mq with its test dependencies into ./.venv, lint (ruff, import-linter's layer contracts), and run
# the whole test suite.
# Usage: bash scripts/test.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/venv.sh '[dev,spark,examples]'   # installs only when .venv is missing or pyproject.toml changed
# tests/docs/test_readme.py runs the README's curl examples.
if ! command -v curl > /dev/null && [ "$(id -u)" = 0 ] && command -v apt-get > /dev/null; then
    echo "installing curl (the README's examples use it)..." >&2
    apt-get update -qq && apt-get install -y -qq --no-install-recommends curl ca-certificates > /dev/null
fi
# The console's browser test (tests/browser) drives Debian's headless Chromium; install it when missing
# (as root, e.g. CI). Without it the browser test is skipped locally and fails under CI=true.
if [ ! -x /usr/lib/chromium/chromium-headless-shell ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "installing chromium-headless-shell for the browser test (apt-get)" >&2
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium-headless-shell >/dev/null
fi
# tests/cluster needs GlusterFS (and faketime for its clock-skew test): installed when running as root and missing.
if [[ $(id -u) -eq 0 ]] && ! { command -v glusterd && command -v faketime; } >/dev/null 2>&1; then
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq glusterfs-server glusterfs-client \
        faketime; } >/dev/null 2>&1 || echo "test.sh: could not install GlusterFS; the cluster tests will say why" >&2
fi
.venv/bin/ruff check .
.venv/bin/lint-imports --no-cache
# The tests start a few hundred daemon and mqctl processes: compile the sources once, so that none of
# them compiles the same modules again (PYTHONDONTWRITEBYTECODE=1 environments never cache them).
.venv/bin/python -m compileall -q mqcore daemons
exec .venv/bin/python -m pytest "$@"
