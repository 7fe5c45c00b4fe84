"""`dpmed flower-certs`: the server certificate is signed by the CA and names the SuperLink's
addresses, private keys are owner-only, and the SuperNode keys are in the one format Flower 1.23
reads (OpenSSH ECDSA: its own loaders accept them; a PEM EC key of the same curve is refused)."""

from __future__ import annotations

import ipaddress
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from dpmed.cli import main as dpmed

pytest.importorskip("flwr")
from flwr.cli.supernode.register import try_load_public_key  # noqa: E402


@pytest.fixture(scope="module")
def credentials(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("credentials")
    dpmed(
        ["flower-certs", "--out", str(out), "--nodes", "2", "--hosts", "10.1.2.3", "link.example"]
    )
    return out


def test_the_server_certificate_is_the_cas_and_names_the_hosts(credentials):
    tls = credentials / "certificates"
    ca = x509.load_pem_x509_certificate((tls / "ca.crt").read_bytes())
    server = x509.load_pem_x509_certificate((tls / "server.pem").read_bytes())
    assert server.issuer == ca.subject
    ca.public_key().verify(
        server.signature, server.tbs_certificate_bytes, ec.ECDSA(server.signature_hash_algorithm)
    )
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    names = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("10.1.2.3")]
    assert names.get_values_for_type(x509.DNSName) == ["link.example"]
    server_key = serialization.load_pem_private_key((tls / "server.key").read_bytes(), None)
    assert server_key.public_key() == server.public_key()


def test_private_keys_are_owner_only(credentials):
    private = [
        credentials / "certificates" / "ca.key",
        credentials / "certificates" / "server.key",
        *(credentials / "keys" / f"supernode-{k}" for k in range(2)),
    ]
    for path in private:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path


def test_node_keys_are_openssh_ecdsa_as_flower_reads_them(credentials):
    for k in range(2):
        key_file = credentials / "keys" / f"supernode-{k}"
        private = serialization.load_ssh_private_key(key_file.read_bytes(), None)  # as SuperNodes
        public = Path(f"{key_file}.pub").read_bytes()
        assert public.startswith(b"ecdsa-sha2-nistp384 ")
        registered = try_load_public_key(Path(f"{key_file}.pub"))  # as `flwr supernode register`
        assert registered == private.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    first = serialization.load_ssh_public_key(
        (credentials / "keys" / "supernode-0.pub").read_bytes()
    )
    second = serialization.load_ssh_public_key(
        (credentials / "keys" / "supernode-1.pub").read_bytes()
    )
    assert first != second


def test_a_pem_ec_public_key_is_refused_by_flower(tmp_path):
    """Why the keys are OpenSSH: Flower's registration refuses the PEM form of a valid key."""
    key = ec.generate_private_key(ec.SECP384R1()).public_key()
    pem = tmp_path / "node.pem.pub"
    pem.write_bytes(
        key.public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    with pytest.raises(SystemExit) as refused:
        try_load_public_key(pem)
    assert refused.value.code != 0
