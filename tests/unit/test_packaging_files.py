"""The shipped configuration and systemd units agree with the daemons' real options.

``config/mq.toml`` must name only options the daemons know (an unknown key is a
configuration error at start-up, exit 78), list every option with its built-in
default, and ``config/mq.env`` must show every option's environment variable.
The units in ``systemd/`` must pass ``systemd-analyze verify`` with no output at
all: it exits 0 on unknown keys and bad values and only warns on stderr
(../shared/notes/fault-testing.md), so any stderr line is a failure.

The daemons' click commands are read from each module's ``cli`` attribute
(``daemons.front``, ``daemons.mover``, ``daemons.reaper``). A module that does
not exist yet is skipped locally and fails under ``CI=true``; so does a missing
``systemd-analyze``.
"""

from __future__ import annotations

import importlib
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import click
import pytest

from daemons import _runtime

REPO = Path(__file__).resolve().parents[2]
TOML_PATH = REPO / "config" / "mq.toml"
ENV_PATH = REPO / "config" / "mq.env"
SYSTEMD_DIR = REPO / "systemd"
UNITS = ("mq.service", "mq-mover.service", "mq-reaper.service", "mq.target", "mq.socket")
#: Highest `systemd-analyze security` exposure allowed for each service (issue 16; 10 = unprotected).
MAX_EXPOSURE = 2.0
#: TOML table -> (module, console script) of each daemon.
DAEMONS = {
    "mq": ("daemons.front", "mq"),
    "mq-mover": ("daemons.mover", "mq-mover"),
    "mq-reaper": ("daemons.reaper", "mq-reaper"),
}
#: Where the units expect the console scripts (`pip install .` as root).
INSTALLED_BIN = "/usr/local/bin/"
#: The root the packaged files use; the built-in default (/tmp/mq) is for trying mq out.
PACKAGED_ROOT = "/var/lib/mq"
#: Environment variables in mq.env that are not click options.
EXTRA_ENV = {"MQ_NO_INOTIFY"}
IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def _skip_or_fail(reason: str) -> None:
    """Skip locally; under CI=true a missing prerequisite is a failure."""
    if IN_CI:
        pytest.fail(f"{reason} (CI is set, so this is not skipped)")
    pytest.skip(reason)


def _command(section: str) -> click.Command:
    """The click command of the daemon configured by TOML table ``section``."""
    module_name = DAEMONS[section][0]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name:
            raise
        _skip_or_fail(f"{module_name} does not exist yet")
    command = getattr(module, "cli", None)
    assert isinstance(command, click.Command), f"{module_name} must expose its click command as `cli`"
    return command


def _options(command: click.Command) -> dict[str, click.Option]:
    """The command's options by parameter name (``visibility_timeout``), without ``--config``."""
    return {p.name: p for p in command.params if isinstance(p, click.Option) and p.name and p.name != "config"}


def _toml() -> dict[str, Any]:
    with TOML_PATH.open("rb") as fh:
        return tomllib.load(fh)


def test_toml_has_only_the_tables_the_daemons_read() -> None:
    data = _toml()
    assert data["root"] == PACKAGED_ROOT
    tables = {k for k, v in data.items() if isinstance(v, dict)}
    assert tables == set(DAEMONS)
    assert {k for k, v in data.items() if not isinstance(v, dict)} == set(_runtime.SHARED_KEYS)


@pytest.mark.parametrize("section", sorted(DAEMONS))
def test_toml_keys_are_options_of_their_daemon(section: str) -> None:
    command = _command(section)
    known = {p.name for p in command.params if p.name}
    # The loader the daemons use: raises ConfigError on any key the daemon does not know.
    loaded = _runtime.load_config_file(str(TOML_PATH), section, known)
    assert loaded["root"] == PACKAGED_ROOT
    assert set(loaded) <= known


@pytest.mark.parametrize("section", sorted(DAEMONS))
def test_toml_lists_every_option_with_its_default(section: str) -> None:
    options = _options(_command(section))
    table = {key.replace("-", "_"): value for key, value in _toml()[section].items()}
    missing = set(options) - set(table) - {"root"}
    assert not missing, f"[{section}] in config/mq.toml lacks {sorted(missing)}"
    for name, value in table.items():
        default = options[name].default
        assert value == default, f"[{section}] {name} = {value!r}, but the built-in default is {default!r}"


def test_env_file_shows_every_environment_variable_commented_out() -> None:
    lines = ENV_PATH.read_text().splitlines()
    assert not [line for line in lines if line.strip() and not line.lstrip().startswith("#")], (
        "every setting in config/mq.env must be commented out"
    )
    listed = {m.group(1) for line in lines if (m := re.match(r"#(MQ_[A-Z0-9_]+)=", line))}
    wanted = set(EXTRA_ENV) | {"MQ_CONFIG"}
    for section in DAEMONS:
        command = _command(section)
        for option in _options(command).values():
            envvars = [option.envvar] if isinstance(option.envvar, str) else list(option.envvar or ())
            assert envvars, f"{section} --{option.name} has no environment variable"
            wanted.update(envvars)
    assert wanted == listed, f"missing: {sorted(wanted - listed)}, unknown: {sorted(listed - wanted)}"


def _unit_keys(path: Path) -> dict[str, list[str]]:
    keys: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        if "=" in line and not line.startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            keys.setdefault(key.strip(), []).append(value.strip())
    return keys


@pytest.mark.parametrize("section", sorted(DAEMONS))
def test_service_runs_its_console_script_with_the_shared_config(section: str) -> None:
    script = DAEMONS[section][1]
    keys = _unit_keys(SYSTEMD_DIR / f"{script}.service")
    assert keys["ExecStart"] == [f"{INSTALLED_BIN}{script} --config /etc/mq/mq.toml"]
    assert keys["EnvironmentFile"] == ["-/etc/mq/mq.env"]
    assert keys["Type"] == ["notify"]
    assert keys["Restart"] == ["on-failure"]
    assert keys["RestartPreventExitStatus"] == [f"{_runtime.EXIT_USAGE} {_runtime.EXIT_CONFIG}"]
    assert keys["PartOf"] == keys["WantedBy"] == ["mq.target"]
    assert keys["ReadWritePaths"] == [PACKAGED_ROOT]
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert pyproject["project"]["scripts"][script] == f"{DAEMONS[section][0]}:main"


def test_target_wants_the_three_services() -> None:
    keys = _unit_keys(SYSTEMD_DIR / "mq.target")
    assert set(keys["Wants"][0].split()) == {f"{script}.service" for _, script in DAEMONS.values()}
    assert keys["WantedBy"] == ["multi-user.target"]


def test_units_pass_systemd_analyze_verify(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        _skip_or_fail("systemd-analyze is not installed")
    # verify fails if ExecStart's binary is missing: point copies at this environment's scripts.
    bin_dir = Path(sys.executable).parent
    for _, script in DAEMONS.values():
        assert (bin_dir / script).exists(), f"{bin_dir / script} missing: run `pip install -e .`"
    for unit in UNITS:
        text = (SYSTEMD_DIR / unit).read_text()
        (tmp_path / unit).write_text(text.replace(f"ExecStart={INSTALLED_BIN}", f"ExecStart={bin_dir}/"))
    result = subprocess.run(
        [analyze, "verify", "--man=no", *UNITS],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "SYSTEMD_LOG_COLOR": "0"},
        check=False,
    )
    assert result.returncode == 0 and not result.stderr and not result.stdout, (
        f"systemd-analyze verify exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    )


def _installed_copies(tmp_path: Path) -> Path:
    """Copies of the units whose ExecStart points at this environment's console scripts."""
    bin_dir = Path(sys.executable).parent
    for unit in UNITS:
        text = (SYSTEMD_DIR / unit).read_text()
        (tmp_path / unit).write_text(text.replace(f"ExecStart={INSTALLED_BIN}", f"ExecStart={bin_dir}/"))
    return tmp_path


@pytest.mark.parametrize("section", sorted(DAEMONS))
def test_service_exposure_is_at_most_2(section: str, tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        _skip_or_fail("systemd-analyze is not installed")
    unit = f"{DAEMONS[section][1]}.service"
    result = subprocess.run(
        [analyze, "security", "--offline=true", "--no-pager", unit],
        cwd=_installed_copies(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "SYSTEMD_LOG_COLOR": "0", "SYSTEMD_COLORS": "0"},
        check=False,
    )
    match = re.search(r"Overall exposure level for \S+: ([0-9.]+)", result.stdout)
    assert match, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    assert float(match.group(1)) <= MAX_EXPOSURE, result.stdout


@pytest.mark.parametrize("section", sorted(DAEMONS))
def test_services_are_hardened_and_have_a_watchdog(section: str) -> None:
    keys = _unit_keys(SYSTEMD_DIR / f"{DAEMONS[section][1]}.service")
    for key, value in {
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "NoNewPrivileges": "yes",
        "CapabilityBoundingSet": "",
        "MemoryDenyWriteExecute": "yes",
        "StateDirectory": "mq",
        "User": "mq",
    }.items():
        assert keys.get(key) == [value], f"{section}: {key}={keys.get(key)}"
    assert keys["SystemCallFilter"][0] == "@system-service"
    assert int(keys["WatchdogSec"][0]) > 0
    families = set(keys["RestrictAddressFamilies"][0].split())
    assert families <= {"AF_INET", "AF_INET6", "AF_UNIX"} and "AF_UNIX" in families  # AF_UNIX: sd_notify


def test_mq_unit_states_the_daemons_shutdown_wait() -> None:
    from daemons.front import SHUTDOWN_TIMEOUT_SECONDS

    text = (SYSTEMD_DIR / "mq.service").read_text()
    match = re.search(r"up to (\d+) s in the daemon", text)
    assert match and float(match.group(1)) == SHUTDOWN_TIMEOUT_SECONDS
    stop = int(_unit_keys(SYSTEMD_DIR / "mq.service")["TimeoutStopSec"][0])
    assert stop > SHUTDOWN_TIMEOUT_SECONDS  # systemd never kills a stop that is within the daemon's own wait


def test_socket_unit_activates_mq_on_loopback() -> None:
    keys = _unit_keys(SYSTEMD_DIR / "mq.socket")
    assert keys["Service"] == ["mq.service"]
    assert keys["ListenStream"] == ["127.0.0.1:8080"]
    config = _toml()["mq"]
    assert f"{config['address']}:{config['port']}" == keys["ListenStream"][0]


def test_sysusers_file_creates_the_mq_user(tmp_path: Path) -> None:
    sysusers = shutil.which("systemd-sysusers")
    if sysusers is None:
        _skip_or_fail("systemd-sysusers is not installed")
    (tmp_path / "etc").mkdir()
    result = subprocess.run(
        [sysusers, f"--root={tmp_path}", str(SYSTEMD_DIR / "mq.sysusers")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    passwd = (tmp_path / "etc" / "passwd").read_text().splitlines()
    user = next(line.split(":") for line in passwd if line.startswith("mq:"))
    assert user[5] == PACKAGED_ROOT and user[6] == "/usr/sbin/nologin"
    assert any(line.startswith("mq:") for line in (tmp_path / "etc" / "group").read_text().splitlines())
