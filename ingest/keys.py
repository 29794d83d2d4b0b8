"""API keys: random tokens shown once, stored only as their SHA-256, with scopes.

A token is `tfk_` and 32 random bytes (base64url), so its SHA-256 cannot be searched
backwards: a plain hash is enough, and no per-key salt or slow hash is needed (those
protect low-entropy passwords). Redis holds, under the configured prefix:

    keys              hash   name -> digest           (list, revoke by name)
    key:<digest>      hash   id, name, scopes, created_at

A revocation deletes both; every ingest instance trusts a looked-up key for
`key_cache_s` (2 s by default), so a revoked key stops working everywhere within that.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from redis.asyncio import Redis

from ingest.redis_mux import MuxRedis, as_text

TOKEN_PREFIX = "tfk_"
TOKEN_RE = re.compile(r"^tfk_[A-Za-z0-9_-]{43}$")
NAME_RE = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
SCOPES = ("submit", "read", "admin")

_CREATE = """
if redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) == 0 then return 0 end
redis.call('HSET', KEYS[2], 'id', ARGV[3], 'name', ARGV[1], 'scopes', ARGV[4],
           'created_at', ARGV[5])
return 1
"""
# the key, and its own limit and bucket (ingest.limits), which no other key can use
_REVOKE = """
local digest = redis.call('HGET', KEYS[1], ARGV[1])
if not digest then return 0 end
local id = redis.call('HGET', ARGV[2] .. digest, 'id')
if id then
  redis.call('DEL', ARGV[3] .. 'limits:key:' .. id, ARGV[3] .. 'bucket:key:' .. id)
end
redis.call('DEL', ARGV[2] .. digest)
redis.call('HDEL', KEYS[1], ARGV[1])
return 1
"""


class KeyStoreError(ValueError):
    """A key that cannot be created (bad name or scopes, name taken)."""


@dataclass(frozen=True)
class KeyRecord:
    id: str
    name: str
    scopes: frozenset[str]
    created_at: str

    def allows(self, scope: str) -> bool:
        return scope in self.scopes or "admin" in self.scopes

    def public(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "scopes": sorted(self.scopes),
            "created_at": self.created_at,
        }


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def digest(token: str) -> str:
    return hashlib.sha256(token.encode("ascii")).hexdigest()


def parse_scopes(text: str | Iterable[str]) -> frozenset[str]:
    items = text.split(",") if isinstance(text, str) else list(text)
    scopes = frozenset(s.strip() for s in items if s.strip())
    unknown = scopes - set(SCOPES)
    if unknown or not scopes:
        raise KeyStoreError(f"scopes must be some of {', '.join(SCOPES)}")
    return scopes


def _record(fields: Mapping[bytes, bytes] | Mapping[bytes | str, bytes | str]) -> KeyRecord | None:
    if not fields:
        return None
    f = {as_text(k): as_text(v) for k, v in fields.items()}
    return KeyRecord(f["id"], f["name"], frozenset(f["scopes"].split(",")), f["created_at"])


class KeyStore:
    def __init__(self, redis: Redis | MuxRedis, prefix: str) -> None:
        self.redis = redis
        self.prefix = prefix
        self.index = prefix + "keys"
        self.record_prefix = prefix + "key:"
        self._create = redis.register_script(_CREATE)
        self._revoke = redis.register_script(_REVOKE)

    async def create(self, name: str, scopes: str | Iterable[str]) -> tuple[str, KeyRecord]:
        """A new key: (the token, shown once, and its record)."""
        if not NAME_RE.match(name):
            raise KeyStoreError("a key name is 1-64 characters of A-Z a-z 0-9 . _ -")
        scope_set = parse_scopes(scopes)
        token = new_token()
        record = KeyRecord(
            secrets.token_hex(8),
            name,
            scope_set,
            datetime.now(timezone.utc).isoformat(timespec="seconds"),
        )
        d = digest(token)
        args = [name, d, record.id, ",".join(sorted(scope_set)), record.created_at]
        if not await self._create(keys=[self.index, self.record_prefix + d], args=args):
            raise KeyStoreError(f"a key named {name} exists; revoke it first")
        return token, record

    async def revoke(self, name: str) -> bool:
        args = [name, self.record_prefix, self.prefix]
        return bool(await self._revoke(keys=[self.index], args=args))

    async def lookup(self, token_digest: str) -> KeyRecord | None:
        return _record(await self.redis.hgetall(self.record_prefix + token_digest))

    async def by_name(self, name: str) -> KeyRecord | None:
        d = await self.redis.hget(self.index, name)
        return None if d is None else await self.lookup(as_text(d))

    async def list(self) -> list[KeyRecord]:
        digests = await self.redis.hgetall(self.index)
        records = [await self.lookup(as_text(d)) for d in digests.values()]
        return sorted((r for r in records if r is not None), key=lambda r: r.name)


@dataclass
class _Cached:
    record: KeyRecord | None
    at: float


class KeyCache:
    """Looked-up keys (and unknown tokens), bounded so random tokens cannot grow it."""

    def __init__(self, fresh_s: float, max_entries: int = 10_000) -> None:
        self.fresh_s = fresh_s
        self.max_entries = max_entries
        self._entries: OrderedDict[str, _Cached] = OrderedDict()

    def get(self, token_digest: str, max_age_s: float | None = None) -> _Cached | None:
        """The entry if younger than `max_age_s` (default: the fresh time)."""
        entry = self._entries.get(token_digest)
        limit = self.fresh_s if max_age_s is None else max_age_s
        if entry is None or time.monotonic() - entry.at >= limit:
            return None
        return entry

    def put(self, token_digest: str, record: KeyRecord | None) -> None:
        self._entries[token_digest] = _Cached(record, time.monotonic())
        self._entries.move_to_end(token_digest)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
