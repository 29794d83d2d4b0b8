"""The audit records' digest of a ticket's text is keyed (agents/audit.py)."""

from __future__ import annotations

import hashlib
import logging
import os
import stat

import pytest
from pydantic import SecretStr

from agents.audit import AuditDigest, AuditKeyError, audit_digest, key_file
from streams.settings import Settings

KEY = "k" * 40
OTHER = "o" * 40
TEXT = "我要退款，商品坏了 / refund please"


def test_same_text_and_key_same_digest_another_key_another():
    a, b = AuditDigest(SecretStr(KEY)), AuditDigest(SecretStr(KEY))
    assert a(TEXT) == b(TEXT)
    assert len(a(TEXT)) == 64 and int(a(TEXT), 16) >= 0
    assert AuditDigest(SecretStr(OTHER))(TEXT) != a(TEXT)
    assert a(TEXT + " ") != a(TEXT)
    # no longer the bare SHA-256 anyone could recompute from a guess
    assert a(TEXT) != hashlib.sha256(TEXT.encode()).hexdigest()


def test_the_key_is_in_no_repr_and_no_log(monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("TICKETFLOW_AUDIT_KEY", KEY)
    caplog.set_level(logging.DEBUG)
    s = Settings(state_dir=tmp_path)
    digest = audit_digest(s)
    digest(TEXT)
    assert KEY not in repr(s) and KEY not in str(s) and KEY not in repr(digest)
    assert KEY not in caplog.text
    assert not key_file(s).exists()  # a given key is not written anywhere


def test_a_weak_key_is_refused():
    with pytest.raises(AuditKeyError):
        AuditDigest(SecretStr("short"))


def test_a_key_file_is_read(tmp_path):
    path = tmp_path / "audit-key"
    path.write_text(OTHER + "\n")
    s = Settings(state_dir=tmp_path, audit_key_file=path)
    assert audit_digest(s)(TEXT) == AuditDigest(SecretStr(OTHER))(TEXT)


def test_without_a_key_one_is_generated_private_and_kept(monkeypatch, tmp_path, caplog):
    monkeypatch.delenv("TICKETFLOW_AUDIT_KEY", raising=False)
    monkeypatch.delenv("TICKETFLOW_AUDIT_KEY_FILE", raising=False)
    caplog.set_level(logging.DEBUG)
    s = Settings(state_dir=tmp_path)
    first = audit_digest(s)(TEXT)
    path = key_file(s)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert audit_digest(s)(TEXT) == first  # the next start reads the same key back
    assert path.read_text().strip() not in caplog.text
    assert str(path) in caplog.text  # where it is, for the operator
    os.chmod(path, 0o644)
    with pytest.raises(AuditKeyError, match="read by others"):
        audit_digest(s)
