#!/usr/bin/env bash
# Install mq with its test dependencies into ./.venv, lint, and run the whole test suite.
# Usage: bash scripts/test.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
.venv/bin/ruff check .
exec .venv/bin/python -m pytest "$@"
