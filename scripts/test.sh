#!/usr/bin/env bash
# Install mq with its test dependencies into ./.venv, lint (ruff, import-linter's layer contracts), and run
# the whole test suite.
# Usage: bash scripts/test.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/venv.sh '[dev,spark,examples]'   # installs only when .venv is missing or pyproject.toml changed
.venv/bin/ruff check .
.venv/bin/lint-imports --no-cache
exec .venv/bin/python -m pytest "$@"
