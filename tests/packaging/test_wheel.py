"""The built distribution, not the checkout: ``python -m build`` makes the sdist and, from it,
the wheel; the wheel is installed with pip into a fresh venv; its console scripts answer
``--help``, ``mq`` serves from it, and the systemd units, sysusers file and configuration are
installed under ``<prefix>/share/mq/``.

Speed: the build runs ``--no-isolation`` with the backend of the dev extra (setuptools, wheel;
a build environment per run costs ~30 s here); the wheel goes in with ``--no-deps``, and the new
venv sees this test venv's dependencies through a ``.pth`` line (a plain path: the editable
install's own ``.pth`` hook is not processed there, so ``mq`` can only come from the wheel, which
the test checks). A full ``pip install`` of the wheel with its dependencies takes ~40 s more. The new venv has no
pip of its own (``--without-pip``): this test venv's pip installs into it through ``pip --python``.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = ("mq", "mq-mover", "mq-reaper", "mq-stack", "mqctl")
SHARED = {
    "systemd": {"mq.service", "mq-mover.service", "mq-reaper.service", "mq.target", "mq.socket", "mq.sysusers"},
    "config": {"mq.toml", "mq.env"},
}


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the wheel built from this checkout's sdist installed (no deps)."""
    out = tmp_path_factory.mktemp("dist")
    built = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(REPO)],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    wheels = list(out.glob("mq-*.whl"))
    assert len(wheels) == 1 and list(out.glob("mq-*.tar.gz")), sorted(os.listdir(out))
    venv = tmp_path_factory.mktemp("venv") / "v"
    # No pip of its own (ensurepip: ~16 s, 6.5 CPU-s here); this venv's pip installs into it (`pip --python`).
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout.strip()  # fmt: skip
    deps = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (Path(purelib) / "zz_test_deps.pth").write_text("".join(f"{d}\n" for d in sorted(deps)))
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps",
         "--disable-pip-version-check", str(wheels[0])],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr
    return venv


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("MQ_", "PYTHON"))}


def test_the_package_comes_from_the_wheel(wheel_venv: Path) -> None:
    done = subprocess.run(
        [wheel_venv / "bin" / "python", "-c", "import daemons, mqcore; print(daemons.__file__, mqcore.__file__)"],
        capture_output=True, text=True, cwd="/", env=_env(), timeout=60, check=True,
    )  # fmt: skip
    for path in done.stdout.split():
        assert path.startswith(str(wheel_venv)), done.stdout


@pytest.mark.parametrize("script", SCRIPTS)
def test_console_scripts_answer_help(wheel_venv: Path, script: str) -> None:
    done = subprocess.run(
        [wheel_venv / "bin" / script, "--help"], capture_output=True, text=True, cwd="/", env=_env(), timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "Usage:" in done.stdout or "usage:" in done.stdout


def test_units_and_config_are_installed(wheel_venv: Path) -> None:
    for folder, names in SHARED.items():
        installed = wheel_venv / "share" / "mq" / folder
        assert set(os.listdir(installed)) == names
        for name in names:
            assert (installed / name).read_bytes() == (REPO / folder / name).read_bytes()


def test_mq_from_the_wheel_serves_and_stops(wheel_venv: Path, tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [wheel_venv / "bin" / "mq", "--root", str(tmp_path / "root"), "--port", "0"],
        stderr=subprocess.PIPE, text=True, cwd="/", env=_env(),
    )  # fmt: skip
    assert proc.stderr is not None
    with proc.stderr:
        try:
            for line in proc.stderr:
                if re.search(r"mq listening on http://127\.0\.0\.1:\d+", line):
                    break
            else:
                pytest.fail(f"mq exited {proc.wait()} before listening")
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0
