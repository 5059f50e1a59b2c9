"""mq over HTTPS (``--tls-cert``/``--tls-key``) with certificates from trustme: a client that
verifies against the right CA works, one without it or with another CA is refused, plain HTTP to
the TLS port fails cleanly and leaves mq serving (docs/security.md)."""

from __future__ import annotations

import os
import ssl
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import trustme

from mqcore.client import Client
from mqcore.errors import ConnectionFailed
from tests.conftest import REPO, Daemon, Daemons


@pytest.fixture(scope="module")
def tls_mq(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Daemon, Path]]:
    """mq serving HTTPS with a certificate for 127.0.0.1 signed by a fresh CA; yields (mq, CA PEM path)."""
    base = tmp_path_factory.mktemp("tls")
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert.private_key_and_cert_chain_pem.write_to_path(str(base / "server.pem"))
    cert.private_key_pem.write_to_path(str(base / "key.pem"))
    ca.cert_pem.write_to_path(str(base / "ca.pem"))
    started = Daemons()
    try:
        mq = started.start(
            "mq", "--root", str(base / "root"), "--port", "0",
            "--tls-cert", str(base / "server.pem"), "--tls-key", str(base / "key.pem"),
        )  # fmt: skip
        yield mq, base / "ca.pem"
    finally:
        started.stop_all()


def test_mq_says_https_and_a_verifying_client_works(tls_mq: tuple[Daemon, Path]) -> None:
    mq, ca = tls_mq
    assert mq.url is not None and mq.url.startswith("https://127.0.0.1:")
    with Client(mq.url, ca_bundle=str(ca), max_retries=0) as client:
        client.create_queue("tls")
        client.send("tls", b"over tls")
        assert [m.body for m in client.receive("tls")] == [b"over tls"]


def test_a_client_without_the_ca_or_with_another_ca_is_refused(tls_mq: tuple[Daemon, Path], tmp_path: Path) -> None:
    mq, _ = tls_mq
    env_bundle = os.environ.pop("MQ_CA_BUNDLE", None)
    try:
        with Client(mq.url, max_retries=0) as client, pytest.raises(ConnectionFailed, match="CERTIFICATE_VERIFY"):
            client.list_queues()
    finally:
        if env_bundle is not None:
            os.environ["MQ_CA_BUNDLE"] = env_bundle
    other = tmp_path / "other-ca.pem"
    trustme.CA().cert_pem.write_to_path(str(other))
    with Client(mq.url, ca_bundle=str(other), max_retries=0) as client, pytest.raises(ConnectionFailed):
        client.list_queues()
    # TLS 1.1 is refused by the server.
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            context.minimum_version = context.maximum_version = ssl.TLSVersion.TLSv1_1
        context.set_ciphers("DEFAULT:@SECLEVEL=0")  # let this client offer TLS 1.1: the server must refuse it
    except (ValueError, ssl.SSLError):
        return  # this OpenSSL cannot even offer TLS 1.1
    with pytest.raises(httpx.ConnectError):
        httpx.get(mq.url + "/", verify=context, timeout=10)


def test_plain_http_to_the_tls_port_fails_cleanly(tls_mq: tuple[Daemon, Path]) -> None:
    mq, ca = tls_mq
    plain = mq.url.replace("https://", "http://")
    with pytest.raises(httpx.HTTPError):
        response = httpx.get(plain + "/", timeout=10)
        assert response.status_code >= 400  # an answer would have to be an error; none is expected
        raise httpx.HTTPError("answered")
    with Client(mq.url, ca_bundle=str(ca), max_retries=0) as client:
        assert "tls" in client.list_queues()
    assert mq.running


def test_mqctl_verifies_with_mq_ca_bundle(tls_mq: tuple[Daemon, Path]) -> None:
    mq, ca = tls_mq
    env = {k: v for k, v in os.environ.items() if not k.startswith("MQ_")}
    env.update(MQ_URL=mq.url, MQ_CA_BUNDLE=str(ca))
    done = subprocess.run(
        [sys.executable, "-m", "mqcore.ctl", "queues", "list"], env=env, cwd=REPO, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "tls" in done.stdout.split()


def test_a_bad_key_pair_is_a_config_error(tmp_path: Path) -> None:
    ca = trustme.CA()
    cert, other = ca.issue_cert("127.0.0.1"), ca.issue_cert("127.0.0.1")
    cert.cert_chain_pems[0].write_to_path(str(tmp_path / "cert.pem"))
    other.private_key_pem.write_to_path(str(tmp_path / "key.pem"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("MQ_")}
    base = [sys.executable, "-m", "daemons.front", "--root", str(tmp_path / "root"), "--port", "0"]
    for extra in (
        ["--tls-cert", str(tmp_path / "cert.pem"), "--tls-key", str(tmp_path / "key.pem")],
        ["--tls-cert", str(tmp_path / "cert.pem")],
    ):
        done = subprocess.run([*base, *extra], env=env, cwd=REPO, capture_output=True, text=True, timeout=60)
        assert done.returncode == 78, done.stderr
