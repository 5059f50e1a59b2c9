#!/usr/bin/env bash
# Install mq with its test dependencies into ./.venv, lint (ruff, import-linter's layer contracts), and run
# the whole test suite.
# Usage: bash scripts/test.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[dev,spark,examples]'
.venv/bin/ruff check .
.venv/bin/lint-imports --no-cache
exec .venv/bin/python -m pytest "$@"
