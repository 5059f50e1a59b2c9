#!/usr/bin/env bash
# Make sure the venv (./.venv, or $MQ_VENV) has mq installed with EXTRAS; install only when the venv is
# missing or pyproject.toml changed since the last install with these extras (a stamp file in the venv
# holds the sha256 of pyproject.toml), so an unchanged checkout starts without running pip at all.
# Usage: bash scripts/venv.sh [--check] [EXTRAS]      e.g. bash scripts/venv.sh '[dev,spark,examples]'
#   --check: install nothing; exit 0 if the venv is current for EXTRAS, 1 if it would install.
set -euo pipefail
cd "$(dirname "$0")/.."
check=0
if [ "${1:-}" = "--check" ]; then check=1; shift; fi
extras="${1:-}"
venv="${MQ_VENV:-.venv}"
want="$(sha256sum pyproject.toml | cut -d' ' -f1)"
stamp() { # the stamp file of an extras spec: [dev,spark] -> .mq-installed-dev_spark
    local tag="${1//[^A-Za-z0-9]/_}"; tag="${tag#_}"; tag="${tag%_}"
    echo "$venv/.mq-installed${tag:+-$tag}"
}
if [ -x "$venv/bin/python" ] && [ "$(cat "$(stamp "$extras")" 2>/dev/null)" = "$want" ]; then
    exit 0
fi
if [ "$check" = 1 ]; then exit 1; fi
if [ ! -x "$venv/bin/python" ]; then why="no venv yet"
elif [ -e "$(stamp "$extras")" ]; then why="pyproject.toml changed"
else why="not installed with these extras by this script yet"; fi
echo "installing mq${extras} into $venv ($why; about a minute)..." >&2
python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -e ".${extras}"
echo "$want" > "$(stamp "$extras")"
if [ -n "$extras" ]; then echo "$want" > "$(stamp "")"; fi  # the extras include the plain install
