"""The secured stack parts' certificates, made with `openssl` at set-up.

One CA per part and one server certificate signed by it, with the host the clients dial
in its subjectAltName. Both secured parts (kafka_secure, redis_secure) make theirs here.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from .process import StackError

CERT_DAYS = 825


def openssl(*args: str, cwd: Path) -> None:
    exe = shutil.which("openssl")
    if exe is None:
        raise StackError("`openssl` is not on PATH; it makes the secured stack's certificates")
    done = subprocess.run(
        [exe, *args], cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True, check=False
    )
    if done.returncode != 0:
        raise StackError(f"openssl {args[0]} failed: {done.stderr.decode(errors='replace')[-500:]}")


def make_ca(root: Path, common_name: str) -> None:
    """`ca.pem` (public: every client needs it) and `ca.key` (0600) in `root`."""
    openssl(
        "req", "-x509", "-newkey", "rsa:3072", "-sha256", "-nodes", "-days", str(CERT_DAYS),
        "-subj", f"/CN={common_name}", "-keyout", "ca.key", "-out", "ca.pem",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        cwd=root,
    )  # fmt: skip
    (root / "ca.key").chmod(0o600)
    (root / "ca.pem").chmod(0o644)


def sign_server(root: Path, stem: str, common_name: str, host: str, usage: str) -> None:
    """`<stem>.key` (0600) and `<stem>.pem`, signed by the CA in `root`, valid for
    localhost, 127.0.0.1 and `host`; `usage` is the extendedKeyUsage."""
    names = {"DNS:localhost", "IP:127.0.0.1"}
    names.add(f"IP:{host}" if host.replace(".", "").isdigit() else f"DNS:{host}")
    (root / f"{stem}.ext").write_text(
        f"subjectAltName={','.join(sorted(names))}\n"
        f"extendedKeyUsage={usage}\nkeyUsage=digitalSignature,keyEncipherment\n"
    )
    openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={common_name}",
        "-keyout", f"{stem}.key", "-out", f"{stem}.csr", cwd=root,
    )  # fmt: skip
    (root / f"{stem}.key").chmod(0o600)
    openssl(
        "x509", "-req", "-in", f"{stem}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-days", str(CERT_DAYS), "-sha256", "-extfile", f"{stem}.ext",
        "-out", f"{stem}.pem", cwd=root,
    )  # fmt: skip
