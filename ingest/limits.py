"""Token buckets per API key and per client IP, held in Redis and checked atomically.

One Lua script refills and takes from both of a request's buckets (the key's and the
IP's) in one round trip, on Redis's clock (`TIME`), so every ingest instance shares the
same buckets and no instance's clock matters. A request is admitted only when every bucket
has a token; a refused request takes none.

The limits themselves are read by the script from Redis on every call, so
`ticketflow limits set` takes effect on the next request of every instance, with no cache
to expire. Layout under the prefix:

    limits                 hash  key_rate, key_burst, ip_rate, ip_burst  (the defaults)
    limits:key:<key id>    hash  rate, burst                               (one key's own)
    limits:ip:<address>    hash  rate, burst                               (one address's own)
    bucket:key:<key id>    hash  tokens, ts    (expires once it would be full again)
    bucket:ip:<address>    hash  tokens, ts

A request costs one token, whatever it carries: a batch (at most 500 tickets) is one
request, as the quota is there to protect ingest and Redis from request floods; Kafka's
share of a batch is bounded by the batch limit.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import cast

from pydantic import BaseModel, Field
from redis.asyncio import Redis

from ingest.http_fields import Bucket
from ingest.redis_mux import MuxRedis, as_text

_TAKE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local cost = tonumber(ARGV[1])
local n = (#KEYS - 1) / 2
local state = {}
local ok = true
for i = 1, n do
  local bucket, own = KEYS[2 * i], KEYS[2 * i + 1]
  local kind = ARGV[3 * i - 1]
  local rate = tonumber(redis.call('HGET', own, 'rate'))
    or tonumber(redis.call('HGET', KEYS[1], kind .. '_rate')) or tonumber(ARGV[3 * i])
  local burst = tonumber(redis.call('HGET', own, 'burst'))
    or tonumber(redis.call('HGET', KEYS[1], kind .. '_burst')) or tonumber(ARGV[3 * i + 1])
  local b = redis.call('HMGET', bucket, 'tokens', 'ts')
  local tokens = tonumber(b[1]) or burst
  local ts = tonumber(b[2]) or now
  tokens = math.min(burst, tokens + math.max(0, now - ts) * rate)
  if tokens < cost then ok = false end
  state[i] = {bucket, rate, burst, tokens}
end
local out = {ok and 1 or 0}
for i = 1, n do
  local s = state[i]
  local tokens = s[4]
  if ok then tokens = tokens - cost end
  redis.call('HSET', s[1], 'tokens', tostring(tokens), 'ts', tostring(now))
  redis.call('PEXPIRE', s[1], math.ceil(s[3] / s[2] * 1000) + 1000)
  out[#out + 1] = tostring(s[2])
  out[#out + 1] = tostring(s[3])
  out[#out + 1] = tostring(tokens)
end
return out
"""

KINDS = ("key", "ip")


class Limit(BaseModel):
    rate: float = Field(gt=0, le=1_000_000, description="tokens (requests) a second")
    burst: int = Field(ge=1, le=1_000_000, description="the bucket's size")


class Limits(BaseModel):
    """The default buckets: one per API key, one per client IP."""

    key: Limit
    ip: Limit


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    buckets: tuple[Bucket, ...]


def verdict(raw: list[bytes | str | int], names: tuple[str, ...]) -> Verdict:
    """The script's answer: admitted or not, then rate, burst and tokens left per bucket."""
    values = [v.decode() if isinstance(v, bytes) else v for v in raw]
    buckets = tuple(
        Bucket(
            name, float(values[1 + 3 * i]), int(float(values[2 + 3 * i])), float(values[3 + 3 * i])
        )
        for i, name in enumerate(names)
    )
    return Verdict(bool(int(values[0])), buckets)


class LimitStore:
    def __init__(self, redis: Redis | MuxRedis, prefix: str, defaults: Limits) -> None:
        self.redis = redis
        self.prefix = prefix
        self.defaults = defaults
        self._take = redis.register_script(_TAKE)

    @property
    def _admin(self) -> Redis:
        """The client that changes limits: the command line's full one (ingest's MuxRedis
        only takes tokens and reads)."""
        return cast(Redis, self.redis)

    @property
    def defaults_key(self) -> str:
        return self.prefix + "limits"

    def own_key(self, kind: str, ident: str) -> str:
        return f"{self.prefix}limits:{kind}:{ident}"

    def bucket_key(self, kind: str, ident: str) -> str:
        return f"{self.prefix}bucket:{kind}:{ident}"

    async def take(self, ip: str, key_id: str | None) -> Verdict:
        """Take a token from the IP's bucket and, for a known key, from the key's."""
        subjects = [("key", key_id)] if key_id else []
        subjects.append(("ip", ip))
        keys, args = [self.defaults_key], ["1"]
        for kind, ident in subjects:
            assert ident is not None
            default = getattr(self.defaults, kind)
            keys += [self.bucket_key(kind, ident), self.own_key(kind, ident)]
            args += [kind, repr(default.rate), str(default.burst)]
        raw = await self._take(keys=keys, args=args)
        return verdict(raw, tuple(kind for kind, _ in subjects))

    async def get(self) -> Limits:
        """The defaults in force: those stored, else the settings'."""
        stored = _decoded(await self.redis.hgetall(self.defaults_key))
        return Limits(
            **{
                kind: Limit(
                    rate=stored.get(f"{kind}_rate", getattr(self.defaults, kind).rate),
                    burst=stored.get(f"{kind}_burst", getattr(self.defaults, kind).burst),
                )
                for kind in KINDS
            }
        )

    async def set(self, kind: str, limit: Limit) -> None:
        await self._admin.hset(
            self.defaults_key,
            mapping={f"{kind}_rate": repr(limit.rate), f"{kind}_burst": str(limit.burst)},
        )

    async def get_own(self, kind: str, ident: str) -> Limit | None:
        stored = _decoded(await self.redis.hgetall(self.own_key(kind, ident)))
        return Limit(**stored) if stored else None

    async def set_own(self, kind: str, ident: str, limit: Limit | None) -> None:
        """One key's or address's own limit; None removes it (the defaults apply again)."""
        if limit is None:
            await self._admin.delete(self.own_key(kind, ident))
            return
        await self._admin.hset(
            self.own_key(kind, ident),
            mapping={"rate": repr(limit.rate), "burst": str(limit.burst)},
        )

    async def own_all(self) -> dict[str, Limit]:
        """Every key's and address's own limit, by `kind:ident`."""
        out: dict[str, Limit] = {}
        async for name in self._admin.scan_iter(match=self.prefix + "limits:*", count=500):
            ident = as_text(name).removeprefix(self.prefix + "limits:")
            stored = _decoded(await self._admin.hgetall(name))
            if stored:
                out[ident] = Limit(**stored)
        return out


def _decoded(raw: Mapping[bytes, bytes] | Mapping[bytes | str, bytes | str]) -> dict[str, str]:
    return {as_text(k): as_text(v) for k, v in raw.items()}
