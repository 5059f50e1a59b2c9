"""mqctl's command group: its options (where requests go), the client it opens on first use, ``auth``.

The group's options say where every command sends its requests: ``--url``
(env MQ_URL) for the HTTP API or ``--root`` (env MQ_ROOT) for brokerless
mode. :class:`ClientOptions` keeps them and opens the client
(:func:`mqcore.client.connect`) only when a command first needs it, so
``--help`` and usage errors import no client at all.
"""

from __future__ import annotations

import json
import secrets
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import click
from click.core import ParameterSource

from mqcore.auth import ACTIONS, access_key_toml, entry_toml
from mqcore.client.api import DEFAULT_URL
from mqcore.client.types import TEXT_CONTENT_TYPE
from mqcore.ctl._output import setup_logging

if TYPE_CHECKING:
    from mqcore.client.api import QueueClient

#: The server URL of this run (None when brokerless), for :func:`mqcore.ctl.main`'s one-line
#: "not answering" error.
server_url: str | None = None


# -- parameters -------------------------------------------------------------------------------------------

_F = TypeVar("_F", bound=Callable[..., Any])


def split_pair(text: str, what: str, option: str) -> tuple[str, str]:
    """Split ``key=value`` at the first ``=``.

    Raises:
        click.BadParameter: No ``=`` or an empty key (exit 64).
    """
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise click.BadParameter(f"expected {what}=VALUE, got {text!r}", param_hint=option)
    return key, value


def parse_queue_attributes(pairs: Sequence[str], option: str) -> dict[str, Any]:
    """Queue attributes from ``key=value`` pairs: a value is read as JSON (``60``, ``null``), else taken as a string.

    Raises:
        click.BadParameter: A pair has no ``=`` (exit 64).
    """
    out: dict[str, Any] = {}
    for pair in pairs:
        key, raw = split_pair(pair, "KEY", option)
        try:
            out[key] = json.loads(raw)
        except ValueError:
            out[key] = raw
    return out


def parse_message_attributes(pairs: Sequence[str]) -> dict[str, str] | None:
    """Message attributes (name -> string) from ``name=value`` pairs; None when there are none.

    Raises:
        click.BadParameter: A pair has no ``=`` (exit 64).
    """
    out = dict(split_pair(pair, "NAME", "--attr") for pair in pairs)
    return out or None


def default_content_type(body: bytes) -> str | None:
    """``text/plain; charset=utf-8`` for a UTF-8 body, None (the server's application/octet-stream) otherwise."""
    try:
        body.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return TEXT_CONTENT_TYPE


# -- the client -------------------------------------------------------------------------------------------


@dataclass
class ClientOptions:
    """Where mqctl sends its requests, from the group's options.

    Attributes:
        url: Base URL of mq (used when ``root`` is None).
        root: Root folder for brokerless mode, or None.
        retries: Extra attempts of an HTTP request after a connection failure, 503 or 429.
        timeout_seconds: HTTP timeout of a request, in seconds (a long poll adds its wait).
        token: Bearer token (``--token``, MQ_TOKEN), or None.
        ca_bundle: PEM CA bundle that verifies an https:// server (``--ca-bundle``, MQ_CA_BUNDLE), or None.
    """

    url: str
    root: str | None
    retries: int
    timeout_seconds: float
    token: str | None = None
    ca_bundle: str | None = None
    _client: QueueClient | None = field(default=None, repr=False)

    def client(self) -> QueueClient:
        """The client, opened on first use (``--help`` and usage errors never connect nor import one)."""
        if self._client is None:
            from mqcore.client import connect  # httpx or the brokerless client: only what this run uses

            if self.root is not None:
                self._client = connect(self.root)
            else:
                self._client = connect(
                    self.url,
                    timeout_seconds=self.timeout_seconds,
                    max_retries=self.retries,
                    token=self.token,
                    ca_bundle=self.ca_bundle,
                )
        return self._client

    def close(self) -> None:
        """Close the client if one was opened."""
        if self._client is not None:
            client, self._client = self._client, None
            client.close()


#: Passes the group's :class:`ClientOptions` to a command as its first argument.
pass_options = click.make_pass_decorator(ClientOptions)


def optional_count(flag: str, name: str, minimum: int, help_text: str) -> Callable[[_F], _F]:
    """A ``--flag N`` option of a whole number >= ``minimum``, None when not given (the server decides).

    Args:
        flag: The option, e.g. ``"--delay"``.
        name: The command's parameter it fills, e.g. ``"delay_seconds"``.
        minimum: The smallest value click accepts (the server checks the upper bound).
        help_text: The ``--help`` text, saying the unit and the default.
    """
    return click.option(flag, name, type=click.IntRange(min=minimum), default=None, help=help_text)


# -- the group --------------------------------------------------------------------------------------------


@click.group(name="mqctl", context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option(
    "--url",
    default=DEFAULT_URL,
    envvar="MQ_URL",
    show_envvar=True,
    show_default=True,
    help="Base URL of the mq server.",
)
@click.option(
    "--root",
    type=click.Path(exists=True, file_okay=False, dir_okay=True),
    default=None,
    envvar="MQ_ROOT",
    show_envvar=True,
    help="Work brokerless on this root folder (the one the daemons use) instead of a server.",
)
@click.option(
    "--retries",
    type=click.IntRange(min=0),
    default=3,
    envvar="MQ_RETRIES",
    show_envvar=True,
    show_default=True,
    help="HTTP only: extra attempts after a connection failure, 503 or 429 (0 = fail at once).",
)
@click.option(
    "--timeout",
    "timeout_seconds",
    type=click.FloatRange(min=0, min_open=True),
    default=30.0,
    envvar="MQ_TIMEOUT",
    show_envvar=True,
    show_default=True,
    help="HTTP only: seconds to wait for an answer (a long poll adds its wait).",
)
@click.option("--token", default=None, envvar="MQ_TOKEN", show_envvar=True, help="HTTP only: bearer token.")
@click.option(
    "--ca-bundle",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    envvar="MQ_CA_BUNDLE",
    show_envvar=True,
    help="HTTPS only: PEM file of the CAs that sign the server's certificate (default: the system's).",
)
@click.option("-v", "--verbose", count=True, help="Log more on stderr: -v info, -vv debug (every HTTP request).")
@click.version_option(package_name="mq", prog_name="mqctl")
@click.pass_context
def cli(
    ctx: click.Context,
    url: str,
    root: str | None,
    retries: int,
    timeout_seconds: float,
    token: str | None,
    ca_bundle: str | None,
    verbose: int,
) -> None:
    """mqctl: manage mq queues and send, receive and inspect messages.

    Talks to the server at --url (env MQ_URL), or, with --root DIR (env MQ_ROOT), works on the
    folder tree directly with no server (brokerless; safe alongside running daemons).
    stdout carries only data; progress and errors go to stderr.
    """
    if root is not None:
        url_source = ctx.get_parameter_source("url")
        root_source = ctx.get_parameter_source("root")
        if url_source == root_source and url_source in (
            ParameterSource.COMMANDLINE,
            ParameterSource.ENVIRONMENT,
        ):
            which = "--url and --root" if url_source == ParameterSource.COMMANDLINE else "MQ_URL and MQ_ROOT"
            raise click.UsageError(f"give only one of {which}", ctx)
        if url_source == ParameterSource.COMMANDLINE:
            root = None  # --url on the command line beats MQ_ROOT in the environment
    if root is None and not url.startswith(("http://", "https://")):
        raise click.BadParameter(f"expected an http:// or https:// URL, got {url!r}", ctx, param_hint="--url")
    setup_logging(verbose)
    global server_url
    server_url = url if root is None else None
    opts = ClientOptions(
        url=url, root=root, retries=retries, timeout_seconds=timeout_seconds, token=token, ca_bundle=ca_bundle
    )
    ctx.obj = opts
    ctx.call_on_close(opts.close)


# -- auth -------------------------------------------------------------------------------------------------


@cli.group()
def auth() -> None:
    """Make entries of the server's --auth-file (docs/security.md)."""


@auth.command("hash")
@click.option("--name", default="client", show_default=True, help="Entry name (logged by mq; never the token).")
@click.option("--queue", "queues_", multiple=True, help="Queue glob it may use (repeatable; default *).")
@click.option(
    "--action", "actions", multiple=True, type=click.Choice(ACTIONS), help="Action (repeatable; default: all)."
)
@click.option("--token-stdin", is_flag=True, help="Hash the token read from stdin instead of making a new one.")
def auth_hash(name: str, queues_: tuple[str, ...], actions: tuple[str, ...], token_stdin: bool) -> None:
    """Print an auth file entry (stdout) for a new random token (printed once on stderr).

    The entry holds only a salted scrypt hash; append it to the auth file and send mq SIGHUP.
    """
    token = sys.stdin.readline().strip() if token_stdin else secrets.token_urlsafe(32)
    if not token:
        raise click.UsageError("the token read from stdin is empty")
    if not token_stdin:
        click.echo(f"token (give it to the client; mq stores only its hash): {token}", err=True)
    click.echo(entry_toml(name, token, list(queues_) or ["*"], list(actions) or list(ACTIONS)), nl=False)


@auth.command("key")
@click.option("--name", default="sqs-client", show_default=True, help="Entry name (logged by mq; never the secret).")
@click.option("--queue", "queues_", multiple=True, help="Queue glob it may use (repeatable; default *).")
@click.option(
    "--action", "actions", multiple=True, type=click.Choice(ACTIONS), help="Action (repeatable; default: all)."
)
def auth_key(name: str, queues_: tuple[str, ...], actions: tuple[str, ...]) -> None:
    """Print an [[access_keys]] entry (stdout) with a new random SQS access key id and secret key.

    SigV4 needs the secret itself, so the entry holds it in clear: keep the auth file mode 0600
    (or 0640 root:mq; mq refuses a file others can read). Give the client the two values as
    aws_access_key_id / aws_secret_access_key, append the entry and send mq SIGHUP.
    """
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"
    key_id = "MQ" + "".join(secrets.choice(alphabet) for _ in range(18))
    secret = secrets.token_urlsafe(30)  # 40 characters, as AWS's
    click.echo(access_key_toml(name, key_id, secret, list(queues_) or ["*"], list(actions) or list(ACTIONS)), nl=False)
