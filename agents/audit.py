"""The digest of a ticket's text in its audit records: HMAC-SHA256 under a deployment key.

An unsalted SHA-256 of the text let anyone who reads `tickets.audit` (180 days of it) confirm
a guess of a ticket's text, and short or templated texts ("refund please") are easy guesses.
Keyed, the digest still matches the same text across records and steps of one deployment,
but cannot be checked without the key. The `input_sha256` field keeps its name and shape
(64 hex characters) so that readers of the topic do not break.

Where the key comes from, in this order:

1. `TICKETFLOW_AUDIT_KEY` (a secret: never in a repr or a log), or
2. `TICKETFLOW_AUDIT_KEY_FILE` (a mounted secret, e.g. a compose or Kubernetes secret), else
3. a key generated once for the deployment in `<TICKETFLOW_STATE_DIR>/secrets/audit.key`
   (folder 0700, file 0600), and read back by every later start on that state directory;
   a worker refuses to start when that file has become readable by others.

We chose (3) over refusing to start: the key then never leaves the host, is never in an
environment or a process listing, and no record is ever written with an unkeyed or a default
digest. Its cost: workers on hosts that do not share the state directory get different keys,
so their digests of one text differ; deployments on more than one host (compose, Kubernetes)
must give every worker the same `TICKETFLOW_AUDIT_KEY(_FILE)`. A key shorter than 32
characters is refused at start-up.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
import stat
from pathlib import Path

from pydantic import SecretStr

from streams.settings import Settings

log = logging.getLogger(__name__)

MIN_KEY_CHARS = 32


class AuditKeyError(RuntimeError):
    pass


class AuditDigest:
    """`digest(text)`: HMAC-SHA256 of the UTF-8 text, 64 lowercase hex characters."""

    def __init__(self, key: SecretStr) -> None:
        raw = key.get_secret_value()
        if len(raw) < MIN_KEY_CHARS:
            raise AuditKeyError(f"the audit key must have at least {MIN_KEY_CHARS} characters")
        self._key = raw.encode()

    def __call__(self, text: str) -> str:
        return hmac.new(self._key, text.encode(), hashlib.sha256).hexdigest()

    def __repr__(self) -> str:
        return "AuditDigest(key=**********)"


def key_file(settings: Settings) -> Path:
    return Path(settings.state_dir) / "secrets" / "audit.key"


def _read(path: Path, private: bool) -> SecretStr:
    try:
        mode = path.stat().st_mode
        if private and mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise AuditKeyError(
                f"{path} may be read by others (mode {oct(mode & 0o777)}); chmod 600"
            )
        return SecretStr(path.read_text().strip())
    except OSError as exc:
        raise AuditKeyError(f"the audit key file {path}: {type(exc).__name__}") from None


def _generate(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.parent.chmod(0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(secrets.token_hex(32) + "\n")
        try:
            # a link fails if the file exists: two workers starting at once agree on one key
            os.link(tmp, path)
            log.warning(
                "audit: no TICKETFLOW_AUDIT_KEY; generated this deployment's key in %s (0600). "
                "Workers on other hosts must be given the same key",
                path,
            )
        except FileExistsError:
            pass
    finally:
        tmp.unlink(missing_ok=True)


def load_key(settings: Settings) -> SecretStr:
    if settings.audit_key is not None:
        return settings.audit_key
    if settings.audit_key_file is not None:
        # the operator's file (a container secret is often 0444 inside its container)
        return _read(Path(settings.audit_key_file), private=False)
    path = key_file(settings)
    if not path.exists():
        _generate(path)
    return _read(path, private=True)


def audit_digest(settings: Settings) -> AuditDigest:
    """The deployment's digest; raises AuditKeyError for a weak or exposed key."""
    return AuditDigest(load_key(settings))
