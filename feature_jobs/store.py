"""How feature views live in Redis: the key layout, the update script, and reading it back.

Key layout (`P` is the key prefix, `tf:fv` by default; `S` is the first 16 hex digits of the
view's signature, so data written under two definitions never mixes):

    P:<view>:__signature__          string  the full signature last built (names it in errors)
    P:<view>:S:__built__            string  the full signature; present once S is rebuilt
    P:<view>:S:{<entity>}           hash    the entity's window state (below)
    P:<view>:S:{<entity>}:ids       zset    event ids seen within the grace period (dedupe)
    P:<view>:S:__recent__           zset    entities updated lately, for drift samples
    P:<view>:S:__reference__        string  the drift checks' reference profile (JSON)

Every key has a TTL. An entity's two keys expire `ttl_seconds` after the later of "now" and
the moment its newest event leaves the view's longest window (plus grace): state that no
window can still see is never kept, and an idle entity costs nothing.

Entity hash fields (`i` is the feature's index in the view):

    _wm              the entity's watermark: its newest event time (ms)
    i|<slot>         windowed count/count_matching: "<bucket>:<count>"; mean: "<bucket>:<sum>:<n>"
    i                unwindowed count, mean: the same with bucket 0; last: "<ts_ms>:<json value>"
    i=<value>        distinct: the newest event time (ms) the value was seen at

A windowed feature keeps a ring of `window/bucket + ceil(grace/bucket) + 1` buckets; a slot
holding an older bucket is reset when a newer one lands in it, so memory per entity is fixed
however many events it gets.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from enum import Enum
from typing import Any

import orjson

from schemas.features import Feature, FeatureView

SIG_CHARS = 16

APPLIED, DUPLICATE, LATE = 0, 1, 2
OUTCOMES = {APPLIED: "applied", DUPLICATE: "duplicate", LATE: "late"}

# One event of one view, atomically: refuse it when late or already seen, else update every
# feature's bucket, move the watermark, prune the dedupe set and set both keys' expiry.
UPDATE_LUA = r"""
local h, z = KEYS[1], KEYS[2]
local ts = tonumber(ARGV[2])
local now, grace = tonumber(ARGV[3]), tonumber(ARGV[4])
local horizon, ttl = tonumber(ARGV[5]), tonumber(ARGV[6])
local nf = (#ARGV - 6) / 4
local fields = {'_wm'}
for j = 1, nf do fields[j + 1] = ARGV[6 + 4 * j - 2] end
local cur = redis.call('HMGET', h, unpack(fields))
local wm = tonumber(cur[1])
if wm and ts < wm - grace then return 2 end
if redis.call('ZADD', z, 'NX', ts, ARGV[1]) == 0 then return 1 end
local out = {}
for j = 1, nf do
  local base = 6 + 4 * j - 3
  local kind, f, n, v = ARGV[base], ARGV[base + 1], tonumber(ARGV[base + 2]), ARGV[base + 3]
  local c = cur[j + 1]
  if kind == 'c' or kind == 'm' then
    local ci, rest
    if c then
      local p = string.find(c, ':', 1, true)
      ci, rest = tonumber(string.sub(c, 1, p - 1)), string.sub(c, p + 1)
    end
    if ci == nil or ci < n then
      if kind == 'c' then out[#out + 1] = f; out[#out + 1] = ARGV[base + 2] .. ':' .. v
      else out[#out + 1] = f; out[#out + 1] = ARGV[base + 2] .. ':' .. v .. ':1' end
    elseif ci == n then
      if kind == 'c' then
        out[#out + 1] = f; out[#out + 1] = ARGV[base + 2] .. ':' .. (tonumber(rest) + tonumber(v))
      else
        local q = string.find(rest, ':', 1, true)
        local s = tonumber(string.sub(rest, 1, q - 1)) + tonumber(v)
        local k = tonumber(string.sub(rest, q + 1)) + 1
        out[#out + 1] = f
        out[#out + 1] = ARGV[base + 2] .. ':' .. string.format('%.17g', s) .. ':' .. k
      end
    end
  elseif kind == 'd' then
    if c == false or tonumber(c) < n then out[#out + 1] = f; out[#out + 1] = ARGV[base + 2] end
  elseif kind == 'l' then
    local ct
    if c then ct = tonumber(string.sub(c, 1, string.find(c, ':', 1, true) - 1)) end
    if ct == nil or ct <= n then out[#out + 1] = f; out[#out + 1] = ARGV[base + 2] .. ':' .. v end
  end
end
if wm == nil or ts > wm then
  wm = ts
  out[#out + 1] = '_wm'; out[#out + 1] = ARGV[2]
end
if #out > 0 then redis.call('HSET', h, unpack(out)) end
redis.call('ZREMRANGEBYSCORE', z, '-inf', '(' .. string.format('%.17g', wm - grace))
local exp = math.max(wm + horizon, now) + ttl
redis.call('PEXPIREAT', h, exp)
redis.call('PEXPIREAT', z, exp)
return 0
"""

# Mark a signature built (and name it the view's current one) unless it already is.
MARK_BUILT_LUA = r"""
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
return 1
"""

# Extend the built marker (and the pointer, when it still names this signature).
REFRESH_BUILT_LUA = r"""
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
if redis.call('GET', KEYS[2]) == ARGV[1] then redis.call('PEXPIRE', KEYS[2], ARGV[2]) end
return 1
"""


@dataclass(frozen=True)
class ViewKeys:
    """The Redis key names of one view under one definition."""

    prefix: str
    view: str
    signature: str

    @classmethod
    def of(cls, view: FeatureView, prefix: str = "tf:fv") -> ViewKeys:
        return cls(prefix, view.name, view.signature())

    @property
    def tag(self) -> str:
        return self.signature[:SIG_CHARS]

    @property
    def pointer(self) -> str:
        return f"{self.prefix}:{self.view}:__signature__"

    @property
    def built(self) -> str:
        return f"{self.prefix}:{self.view}:{self.tag}:__built__"

    @property
    def recent(self) -> str:
        return f"{self.prefix}:{self.view}:{self.tag}:__recent__"

    @property
    def reference(self) -> str:
        return f"{self.prefix}:{self.view}:{self.tag}:__reference__"

    def state(self, entity: str) -> str:
        # the braces are a Redis Cluster hash tag: an entity's keys share a slot
        return f"{self.prefix}:{self.view}:{self.tag}:{{{entity}}}"

    def ids(self, entity: str) -> str:
        return self.state(entity) + ":ids"

    def entity_pattern(self) -> str:
        return f"{self.prefix}:{self.view}:{self.tag}:{{*}}"


def marker_ttl_ms(view: FeatureView) -> int:
    """How long a built marker outlives the job that refreshes it."""
    return (view.horizon_s + view.ttl_seconds) * 1000


# ---- events into script arguments -----------------------------------------------------------


def field_of(record: Any, name: str) -> Any:
    if isinstance(record, dict):
        return record.get(name)
    return getattr(record, name, None)


def to_ms(value: Any) -> int | None:
    """Event time in epoch milliseconds: a datetime, an ISO 8601 string, or epoch seconds."""
    if isinstance(value, datetime):
        dt = value
    elif isinstance(value, str):
        try:
            dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        return int(value * 1000)
    else:
        return None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return int(dt.timestamp() * 1000)


def iso_ms(ts_ms: int) -> str:
    return datetime.fromtimestamp(ts_ms / 1000, timezone.utc).isoformat()


def json_value(value: Any) -> Any:
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=timezone.utc)
        return value.astimezone(timezone.utc).isoformat()
    return value


def slots(feature: Feature, grace_s: int) -> int:
    b = feature.bucket_s
    assert feature.window_seconds is not None, "only a windowed feature has slots"
    return feature.window_seconds // b + -(-grace_s // b) + 1


def _first_chars(items: Any) -> set[str] | None:
    """The characters a match of a parsed (sub)pattern can start with; None: any or unknown."""
    # the parser's opcodes (private, hence the guard below; typeshed does not list them)
    from re import _constants as c  # type: ignore[attr-defined]  # private: typeshed has no stub

    for op, av in items:
        if op is c.AT:
            continue  # zero-width: \b, ^
        if op is c.LITERAL:
            return {chr(av)}
        if op is c.IN:
            out: set[str] = set()
            for iop, iav in av:
                if iop is c.LITERAL:
                    out.add(chr(iav))
                elif iop is c.RANGE and iav[1] - iav[0] < 256:
                    out.update(chr(x) for x in range(iav[0], iav[1] + 1))
                else:
                    return None
            return out
        if op is c.BRANCH:
            out = set()
            for branch in av[1]:
                first = _first_chars(branch)
                if first is None:
                    return None
                out |= first
            return out
        if op is c.SUBPATTERN:
            return _first_chars(av[-1])
        if op in (c.MAX_REPEAT, c.MIN_REPEAT) and av[0] >= 1:
            return _first_chars(av[2])
        return None
    return None


def compile_match(pattern: str) -> re.Pattern[str]:
    """`pattern`, case-insensitive, behind a look-ahead for the characters a match can start
    with when those are known: Python's `re` otherwise tries every alternative at every
    position (a long alternation costs about 20 us per ticket; with the look-ahead, 5).
    The look-ahead only skips positions where no match can start, so matches are the same."""
    plain = re.compile(pattern, re.IGNORECASE)
    try:
        from re import _parser  # type: ignore[attr-defined]  # private: typeshed has no stub

        first = _first_chars(_parser.parse(pattern, re.IGNORECASE).data)
        if not first:
            return plain
        chars = "".join(re.escape(ch) for ch in sorted(first))
        return re.compile(f"(?=[{chars}])(?:{pattern})", re.IGNORECASE)
    except Exception:  # a parser API that moved, global inline flags: the plain pattern
        return plain


OpFn = Callable[[Any, int], "tuple[str, str, str, str] | None"]


def _op(view: FeatureView, i: int, f: Feature) -> OpFn:
    fld = f.field or ""
    if f.bucketed:
        bucket_ms, n = f.bucket_s * 1000, slots(f, view.grace_seconds)

        def place(ts: int) -> tuple[str, str]:
            b = ts // bucket_ms
            return f"{i}|{b % n}", str(b)

    else:

        def place(ts: int) -> tuple[str, str]:
            return str(i), "0"

    if f.aggregation == "count":

        def op(rec: Any, ts: int):
            key, b = place(ts)
            return "c", key, b, "1"

    elif f.aggregation == "count_matching":
        pattern = compile_match(f.match or "")

        def op(rec: Any, ts: int):
            v = field_of(rec, fld)
            if v is None or not pattern.search(str(v)):
                return None
            key, b = place(ts)
            return "c", key, b, "1"

    elif f.aggregation == "mean":
        length = f.transform == "length"

        def op(rec: Any, ts: int):
            v = field_of(rec, fld)
            if v is None:
                return None
            x = len(v) if length else v
            if isinstance(x, bool) or not isinstance(x, (int, float)):
                return None
            key, b = place(ts)
            return "m", key, b, repr(x)

    elif f.aggregation == "distinct":

        def op(rec: Any, ts: int):
            v = json_value(field_of(rec, fld))
            if v is None:
                return None
            return "d", f"{i}={v}", str(ts), ""

    else:  # last

        def op(rec: Any, ts: int):
            v = json_value(field_of(rec, fld))
            return "l", str(i), str(ts), orjson.dumps(v).decode()

    return op


class ViewEncoder:
    """Turns one source record into the update script's keys and arguments for one view."""

    def __init__(self, view: FeatureView, prefix: str = "tf:fv") -> None:
        self.view = view
        self.keys = ViewKeys.of(view, prefix)
        self._ops = [_op(view, i, f) for i, f in enumerate(view.features)]
        self._grace = str(view.grace_seconds * 1000)
        self._horizon = str(view.horizon_s * 1000)
        self._ttl = str(view.ttl_seconds * 1000)
        self.grace_ms = view.grace_seconds * 1000

    def entity(self, record: Any) -> str | None:
        v = field_of(record, self.view.entity)
        if v is None or v == "":
            return None
        return str(json_value(v))

    def event_ms(self, record: Any) -> int | None:
        return to_ms(field_of(record, self.view.event_time_field))

    def event_id(self, record: Any) -> str | None:
        v = field_of(record, self.view.event_id_field)
        return None if v is None else str(v)

    def args(self, record: Any, entity: str, event_id: str, ts: int, now_ms: int) -> list[str]:
        """KEYS and ARGV of UPDATE_LUA (the two keys first), as strings."""
        out = [
            self.keys.state(entity),
            self.keys.ids(entity),
            event_id,
            str(ts),
            str(now_ms),
            self._grace,
            self._horizon,
            self._ttl,
        ]
        for op in self._ops:
            got = op(record, ts)
            if got is not None:
                out.extend(got)
        return out


# ---- the state hash back into feature values ------------------------------------------------


def _split(c: bytes) -> list[bytes]:
    return c.split(b":", 2)


def materialize(view: FeatureView, raw: dict[bytes, bytes], now_ms: int) -> dict[str, Any]:
    """The view's values as of `now_ms` from an entity's hash (empty: no events in reach).

    A window as of T counts the events of its `window/bucket` buckets ending with T's bucket,
    and any dated after T (clock skew; the job refuses more than the grace period ahead).
    """
    per: dict[int, list[tuple[str, bytes]]] = {}
    for k, v in raw.items():
        key = k.decode()
        if key.startswith("_"):
            continue
        j = 0
        while j < len(key) and key[j].isdigit():
            j += 1
        if j == 0:
            continue
        per.setdefault(int(key[:j]), []).append((key[j:], v))
    out: dict[str, Any] = {}
    for i, f in enumerate(view.features):
        items = per.get(i, [])
        # the oldest bucket left out of the window (None: no window)
        lo = None
        if f.bucketed and f.window_seconds is not None:
            lo = now_ms // (f.bucket_s * 1000) - f.window_seconds // f.bucket_s
        if f.aggregation in ("count", "count_matching"):
            total = 0
            for _, v in items:
                b, count = v.split(b":", 1)
                if lo is None or int(b) > lo:
                    total += int(count)
            out[f.name] = total
        elif f.aggregation == "mean":
            s, n = 0.0, 0
            for _, v in items:
                b, sv, nv = _split(v)
                if lo is None or int(b) > lo:
                    s += float(sv)
                    n += int(nv)
            out[f.name] = s / n if n else f.default
        elif f.aggregation == "distinct":
            since = None if f.window_seconds is None else now_ms - f.window_seconds * 1000
            out[f.name] = sorted(rest[1:] for rest, v in items if since is None or int(v) >= since)
        else:  # last
            value = f.default
            for _, v in items:
                ts, js = v.split(b":", 1)
                if f.window_seconds is None or int(ts) >= now_ms - f.window_seconds * 1000:
                    value = orjson.loads(js)
            out[f.name] = value
    return out
