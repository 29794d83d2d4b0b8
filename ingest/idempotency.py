"""`Idempotency-Key` (draft-ietf-httpapi-idempotency-key-header) for `POST /v1/tickets`.

The first request with a key takes the key (in flight); its response is stored when it
ends, for `idempotency_ttl_s`. Another request with the same key then gets:

- the stored response again (with `Idempotent-Replayed: true`) when its payload is the
  same;
- 422 when its payload differs (a client bug: a key names one operation);
- 409 while the first is still in flight.

Keys are per API key (`idem:<key id>:<sha256 of the Idempotency-Key>`), so two clients
choosing the same key never meet. The payload's fingerprint is the SHA-256 of the method,
the path and the body's bytes: a re-sent request is byte-identical, and a reformatted one
is another payload.

A response that says "try again" (a 5xx, or a batch of which Kafka refused some records)
is not stored: the key is released so the same request can be retried with it. The
in-flight mark expires on its own, should the instance holding it die.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import orjson
from redis.asyncio import Redis

from ingest.redis_mux import MuxRedis

_ACQUIRE = """
local v = redis.call('HMGET', KEYS[1], 'state', 'fp', 'response')
if not v[1] then
  redis.call('HSET', KEYS[1], 'state', 'inflight', 'fp', ARGV[1])
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {'new'}
end
if v[2] ~= ARGV[1] then return {'mismatch'} end
if v[1] == 'inflight' then return {'inflight'} end
return {'done', v[3]}
"""
_COMPLETE = """
if redis.call('HGET', KEYS[1], 'fp') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'state', 'done', 'response', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
"""
_RELEASE = """
if redis.call('HGET', KEYS[1], 'state') == 'inflight'
   and redis.call('HGET', KEYS[1], 'fp') == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


def fingerprint(method: str, path: str, body: bytes) -> str:
    h = hashlib.sha256()
    for part in (method.upper().encode(), path.encode(), body):
        h.update(len(part).to_bytes(8, "big"))  # length-prefixed: no two splits hash alike
        h.update(part)
    return h.hexdigest()


@dataclass(frozen=True)
class StoredResponse:
    status: int
    content_type: str
    body: bytes
    headers: dict[str, str]

    def dumps(self) -> bytes:
        return orjson.dumps(
            {
                "status": self.status,
                "content_type": self.content_type,
                "body": self.body.decode("utf-8"),
                "headers": self.headers,
            }
        )

    @classmethod
    def loads(cls, raw: bytes) -> StoredResponse:
        d = orjson.loads(raw)
        return cls(d["status"], d["content_type"], d["body"].encode("utf-8"), d["headers"])


@dataclass(frozen=True)
class Claim:
    """What the store says of a request's key: `new`, `mismatch`, `inflight` or `done`."""

    outcome: str
    stored: StoredResponse | None = None


class IdempotencyStore:
    def __init__(self, redis: Redis | MuxRedis, prefix: str, ttl_s: int, lock_s: float) -> None:
        self.redis = redis
        self.prefix = prefix + "idem:"
        self.ttl_ms = ttl_s * 1000
        # an in-flight mark outlives the longest a request can take, then frees the key
        self.lock_ms = int(lock_s * 1000)
        self._acquire = redis.register_script(_ACQUIRE)
        self._complete = redis.register_script(_COMPLETE)
        self._release = redis.register_script(_RELEASE)

    def key(self, api_key_id: str, idempotency_key: str) -> str:
        h = hashlib.sha256(idempotency_key.encode()).hexdigest()
        return f"{self.prefix}{api_key_id}:{h}"

    async def acquire(self, key: str, fp: str) -> Claim:
        raw = await self._acquire(keys=[key], args=[fp, self.lock_ms])
        outcome = raw[0].decode() if isinstance(raw[0], bytes) else raw[0]
        stored = StoredResponse.loads(raw[1]) if outcome == "done" else None
        return Claim(outcome, stored)

    async def complete(self, key: str, fp: str, response: StoredResponse) -> None:
        await self._complete(keys=[key], args=[fp, response.dumps(), self.ttl_ms])

    async def release(self, key: str, fp: str) -> None:
        await self._release(keys=[key], args=[fp])
