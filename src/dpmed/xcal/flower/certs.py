"""The credentials of a Flower federation with TLS and SuperNode authentication, in the formats
Flower 1.23 reads.

`certificates/`: ca.crt and ca.key (a self-signed certificate authority: every SuperNode and
`flwr` CLI gets ca.crt as its root certificate), server.pem and server.key (the SuperLink's
certificate, signed by the CA, naming each address it is reached at). `keys/`: per SuperNode
supernode-<k> (its private key, for `flower-supernode --auth-supernode-private-key`) and
supernode-<k>.pub (registered with `flwr supernode register`). Node keys are ECDSA P-384 in
OpenSSH format: Flower reads node keys only as OpenSSH keys, a PEM EC key is refused. Private
key files are readable by their owner only.
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import os
from collections.abc import Sequence
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

HOSTS = ("127.0.0.1", "localhost")
VALID_DAYS = 365
CURVE = ec.SECP384R1()


def write_private(path: Path, data: bytes) -> None:
    """Write a private key readable by its owner only (mode 0600 from the start)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )


def certificate(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: x509.Certificate | None,
    issuer_key: ec.EllipticCurvePrivateKey,
    hosts: Sequence[str] = (),
) -> x509.Certificate:
    """A certificate of `key` for `subject`, signed by `issuer_key` (self-signed CA when
    `issuer` is None, else a server certificate naming `hosts`: IP addresses or DNS names)."""
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name if issuer is None else issuer.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
        .add_extension(x509.BasicConstraints(ca=issuer is None, path_length=None), critical=True)
    )
    if issuer is not None:
        names: list[x509.GeneralName] = []
        for host in hosts:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        builder = builder.add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
        )
    return builder.sign(issuer_key, hashes.SHA384())


def make_node_key(path: Path) -> Path:
    """Write a SuperNode's OpenSSH ECDSA P-384 private key to `path` and its public key to
    `path`.pub; returns the public key's path."""
    key = ec.generate_private_key(CURVE)
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    )
    public = key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    write_private(Path(path), private)
    pub = Path(f"{path}.pub")
    pub.write_bytes(public + b"\n")
    return pub


def make_credentials(folder: Path, nodes: int, hosts: Sequence[str] = HOSTS) -> list[Path]:
    """folder/certificates/ca.crt, ca.key, server.pem and server.key (the server certificate
    names `hosts`, the SuperLink's addresses: IPs or DNS names) and folder/keys/supernode-<k>
    for k < `nodes` (`make_node_key`); returns the public keys' paths."""
    certs = Path(folder) / "certificates"
    certs.mkdir(parents=True, exist_ok=True)
    ca_key, server_key = ec.generate_private_key(CURVE), ec.generate_private_key(CURVE)
    ca = certificate("dpmed Flower CA", ca_key, None, ca_key)
    server = certificate(hosts[0], server_key, ca, ca_key, hosts)
    write_private(certs / "ca.key", pem_key(ca_key))
    write_private(certs / "server.key", pem_key(server_key))
    (certs / "ca.crt").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (certs / "server.pem").write_bytes(server.public_bytes(serialization.Encoding.PEM))
    return [make_node_key(Path(folder) / "keys" / f"supernode-{k}") for k in range(nodes)]


def main(argv: Sequence[str] | None = None) -> None:
    """`dpmed flower-certs`: write a federation's certificates and SuperNode keys."""
    parser = argparse.ArgumentParser(
        prog="dpmed flower-certs",
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--out", type=Path, required=True, help="folder to write them into")
    parser.add_argument(
        "--hosts", nargs="+", default=list(HOSTS),
        help="the SuperLink's IP addresses and DNS names (default 127.0.0.1 localhost)",
    )  # fmt: skip
    parser.add_argument("--nodes", type=int, default=3, help="SuperNode keys to make (3)")
    args = parser.parse_args(argv)
    for pub in make_credentials(args.out, args.nodes, args.hosts):
        print(f"{pub.with_suffix('')}  {pub}")
    print(f"{args.out / 'certificates'}: ca.crt ca.key server.pem server.key")
