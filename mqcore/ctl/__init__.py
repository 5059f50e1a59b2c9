"""mqctl: the command line of mq, over HTTP (``--url``) or brokerless on a root folder (``--root``).

One click group with the commands of ``docs/mqctl.md``: ``queues``
(list, create, delete, attributes, stats), ``send`` (one message, or one per
line of a file or stdin, in batches with a progress bar), ``receive``,
``tail`` (follow a queue without consuming: peek polling), ``purge``,
``redrive``, ``dead-letters`` and ``auth hash``. Every command goes through
one client with the interface of :class:`mqcore.client.api.QueueClient`
(:func:`mqcore.client.connect`: a :class:`~mqcore.client.Client` for a URL, a
:class:`~mqcore.client.LocalClient` for a root), so both modes behave the same.

Modules: :mod:`mqcore.ctl._output` (exit codes, error lines, stdout writers),
:mod:`mqcore.ctl._group` (the group's options and the client they open),
:mod:`mqcore.ctl._send` and :mod:`mqcore.ctl._commands` (the commands).

Start-up: each mqctl process imports only what its command uses. The
client (httpx, or the brokerless client) is imported when a command first
needs it, tqdm only to draw a bar; ``--help`` and usage errors import
neither (docs/performance.md, "mqctl start-up").
"""

from __future__ import annotations

import sys

import click

from mqcore.ctl import _commands, _group, _send  # noqa: F401 - _commands and _send add their commands to cli
from mqcore.ctl._group import cli
from mqcore.ctl._output import (
    EXIT_DATAERR,
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_IOERR,
    EXIT_NOINPUT,
    EXIT_OK,
    EXIT_TEMPFAIL,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    CtlError,
    StdoutClosed,
    exit_code_for,
    note,
    report,
)
from mqcore.errors import ConnectionFailed, MQError

__all__ = [
    "EXIT_DATAERR",
    "EXIT_ERROR",
    "EXIT_INTERRUPTED",
    "EXIT_IOERR",
    "EXIT_NOINPUT",
    "EXIT_OK",
    "EXIT_TEMPFAIL",
    "EXIT_UNAVAILABLE",
    "EXIT_USAGE",
    "cli",
    "exit_code_for",
    "main",
]


def _usage_error(exc: click.UsageError) -> int:
    if isinstance(exc, click.exceptions.NoArgsIsHelpError):
        click.echo(exc.format_message(), err=True)
        return EXIT_USAGE
    report("usage", exc.format_message())
    if exc.ctx is not None:
        note(f"Try '{exc.ctx.command_path} --help' for help.")
    return EXIT_USAGE


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``mqctl`` console script; returns the exit code (see the ``EXIT_*`` constants)."""
    # httpx imports its own command line (httpx._main: rich, pygments) when they are installed, which
    # costs more start-up than all of mqctl; mqctl never runs it. A None entry makes that import fail,
    # and httpx then defines a stub instead (its documented fallback without the [cli] extra).
    sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]  # None blocks an import (importlib)
    try:
        rv = cli.main(args=argv, prog_name="mqctl", standalone_mode=False)
    except click.UsageError as exc:
        return _usage_error(exc)
    except ConnectionFailed as exc:
        if _group.server_url is None:
            return _fail(exc.code, exc.message, exit_code_for(exc))
        reason = exc.details.get("reason", "no answer")
        return _fail(
            exc.code,
            f"the server at {_group.server_url} is not answering ({reason}); is mq running?",
            EXIT_UNAVAILABLE,
        )
    except MQError as exc:
        return _fail(exc.code, exc.message, exit_code_for(exc))
    except CtlError as exc:
        return _fail(exc.code, exc.message, exc.exit_code)
    except StdoutClosed:
        return EXIT_ERROR
    except click.ClickException as exc:
        return _fail("error", exc.format_message(), EXIT_ERROR)
    except click.Abort:
        return EXIT_INTERRUPTED
    except OSError as exc:  # the brokerless root: permissions, a vanished folder
        return _fail("io_error", str(exc), EXIT_IOERR)
    return int(rv or 0)


def _fail(code: str, message: str, exit_code: int) -> int:
    report(code, message)
    return exit_code
