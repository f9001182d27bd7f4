"""Security settings checked without serving: what counts as loopback, binding beyond it only
with TLS, keys or --insecure, a warning for tokens sent in plaintext beyond it, and config
errors that name the flag to fix."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from fake_servers import run_cli
from security_helpers import KEY

from minedraft.client import Client, ServerUnavailable
from minedraft.service import security
from minedraft.service.security import DialSecurity, SecurityError, ServerSecurity, check_bind, is_loopback

pytest_plugins = ["security_helpers"]  # certs


def test_is_loopback():
    assert all(map(is_loopback, ["127.0.0.1", "127.8.0.1", "localhost", "::1", "[::1]"]))
    assert not any(map(is_loopback, ["0.0.0.0", "::", "", "10.1.2.3", "example.com"]))


def test_public_bind_beyond_loopback(certs: dict[str, str], caplog):
    open_config = ServerSecurity()
    check_bind("127.0.0.1", open_config, insecure=False)
    with pytest.raises(SecurityError, match="--insecure"):
        check_bind("0.0.0.0", open_config, insecure=False)
    with caplog.at_level(logging.WARNING, logger=security.__name__):
        check_bind("0.0.0.0", open_config, insecure=True)
    assert "open to anyone" in caplog.text and "--insecure" in caplog.text
    check_bind("0.0.0.0", ServerSecurity(tokens=(KEY,)), insecure=False)
    check_bind("10.0.0.1", ServerSecurity(certs["server_cert"], certs["server_key"]), insecure=False)


def test_token_in_plaintext_beyond_loopback_warns(caplog):
    with caplog.at_level(logging.WARNING, logger=security.__name__):
        DialSecurity(token=KEY).channel("127.0.0.1:1").close()
        assert not caplog.text
        DialSecurity(token=KEY).channel("10.0.0.9:50051").close()
    assert "without TLS" in caplog.text and KEY not in caplog.text


def test_config_errors_name_the_flag(certs: dict[str, str], tmp_path: Path, capsys):
    cases = [(lambda: ServerSecurity(key_file=certs["server_key"]), "--tls-cert and --tls-key"),
             (lambda: ServerSecurity(client_ca_file=certs["ca"]), "--tls-client-ca needs --tls-cert"),
             (lambda: ServerSecurity(certs["server_cert"], str(tmp_path / "nope")), "--tls-key: no such file"),
             (lambda: DialSecurity(client_cert_file=certs["client_cert"], client_key_file=certs["client_key"]),
              "--tls-client-cert needs --tls-ca"),
             (lambda: DialSecurity(certs["ca"], client_cert_file=certs["client_cert"]), "--tls-client-key"),
             (lambda: DialSecurity(str(tmp_path / "ca.pem")), "--tls-ca: no such file"),
             (lambda: Client("localhost:1", api_key="two words"), "printable ASCII")]
    for make, message in cases:
        with pytest.raises(SecurityError, match=message):
            make()
    code, _, err = run_cli(["generate", "p", "--tls-ca", str(tmp_path / "missing.pem")], capsys)
    assert code == 2 and "--tls-ca: no such file" in err
    with pytest.raises(ServerUnavailable):      # plaintext to a closed port: nothing changed
        Client("127.0.0.1:1", timeout=2, api_key="").generate("x")
