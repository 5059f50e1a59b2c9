"""``--stop-timeout`` (env ``MQ_STOP_TIMEOUT``, config key ``stop-timeout``): every daemon refuses a bound that is not a
finite number of seconds > 0 at start (exit 78, the layer named), and shows its own default in ``--help``.

What the bound does on a filesystem that stops answering: tests/cluster/test_cluster_hang.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

MODULES = {"mq": "daemons.front", "mq-mover": "daemons.mover", "mq-reaper": "daemons.reaper"}


def _run(module: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MQ_")}
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=REPO,
        env={**clean, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("name", sorted(MODULES))
def test_a_stop_timeout_of_zero_on_the_command_line_is_a_config_error(name: str, tmp_path: Path) -> None:
    out = _run(MODULES[name], "--root", str(tmp_path), "--stop-timeout", "0")
    assert out.returncode == 78, out.stderr
    assert "stop-timeout must be a finite number of seconds > 0" in out.stderr, out.stderr


@pytest.mark.parametrize("name", sorted(MODULES))
def test_a_negative_stop_timeout_in_the_environment_is_a_config_error(name: str, tmp_path: Path) -> None:
    out = _run(MODULES[name], "--root", str(tmp_path), env={"MQ_STOP_TIMEOUT": "-1"})
    assert out.returncode == 78, out.stderr
    assert "stop-timeout must be a finite number of seconds > 0" in out.stderr, out.stderr


@pytest.mark.parametrize(("name", "default"), [("mq", "15.0"), ("mq-mover", "25.0"), ("mq-reaper", "50.0")])
def test_help_shows_each_daemons_default_below_its_units_stop_timeout(name: str, default: str) -> None:
    out = _run(MODULES[name], "--help")
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())
    assert "--stop-timeout FLOAT" in text, text
    own = text.split("--stop-timeout FLOAT", 1)[1].split(" --", 1)[0]  # up to the next option
    assert f"default: {default}" in own, own
