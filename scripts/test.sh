#!/usr/bin/env bash
# Install mq with its test dependencies into ./.venv, lint (ruff, import-linter's layer contracts), and run
# the whole test suite.
# Usage: bash scripts/test.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
# tests/cluster needs GlusterFS (and faketime for its clock-skew test): installed when running as root and missing.
if [[ $(id -u) -eq 0 ]] && ! { command -v glusterd && command -v faketime && command -v getfattr; } >/dev/null 2>&1; then
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq glusterfs-server glusterfs-client \
        faketime attr; } >/dev/null 2>&1 || echo "test.sh: could not install GlusterFS; the cluster tests will say why" >&2
fi
python3 -m venv .venv
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[dev,spark,examples]'
.venv/bin/ruff check .
.venv/bin/lint-imports --no-cache
exec .venv/bin/python -m pytest "$@"
