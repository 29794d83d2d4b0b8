"""Where `GET /v1/tickets/{id}` finds a ticket: a small index in Redis, one hash per ticket.

    ticket:<ticket_id>   owner, submitted_at, trace_id, status, route, result, error_class

Ingest writes the hash when it takes a ticket (before producing it: the first API key to
submit a ticket_id owns it, and another key's record with that id is refused with 409
rather than silently dropped by the workflow as a duplicate). Its own consumer of the
result topics (`tickets.out.*`, read_committed) and of `tickets.dlq` then writes the
outcome into the hashes that exist; results of tickets ingest did not take are skipped, so
the index holds ingest's tickets only and expires with them (`ticket_ttl_s`).

Why an index rather than asking the worker's `/ticket/{id}` table view alone: the table
holds the state but not the `TicketResult`, it answers only while a worker owns the
ticket's partition (not during a rebalance or a restart), and it has no notion of who
submitted a ticket. The worker's view is still asked, best effort, for the live step of a
ticket that has no outcome yet.

A ticket's later outcome wins over an earlier one by rank (a dead letter < awaiting review
< a final result), so a redelivered or replayed record never moves a ticket backwards.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson
import redis
from confluent_kafka import Consumer, KafkaException, Message, TopicPartition
from pydantic import ValidationError
from redis.asyncio import Redis

from ingest.redis_mux import MuxRedis, as_text
from schemas.tickets import TicketResult
from streams.redis_config import Target, sync_client
from streams.topics import Topics

log = logging.getLogger(__name__)

REVIEW_ROUTE = "manual_review"
LIVE_STATUSES = frozenset({"received", "running", "waiting_retry", "awaiting_review"})
TERMINAL = frozenset({"completed", "degraded", "dead_lettered"})
RANKS = {"dead_lettered": 1, "awaiting_review": 2, "completed": 3, "degraded": 3}
_REGEX_SPECIAL = set(".^$*+?()[]{}|\\")

SEP = "\x1f"  # between the fields of a claim or an outcome: never in an id, a time, JSON
# per ticket id: 1 taken now, 2 already this owner's, 0 another owner's. ARGV[1] is the
# claim ("owner SEP submitted_at SEP trace id"), ARGV[3] the owner and SEP
_CLAIM = """
local out = {}
for i, k in ipairs(KEYS) do
  if redis.call('SET', k, ARGV[1], 'NX', 'PX', ARGV[2]) then
    out[i] = 1
  else
    local cur = redis.call('GET', k)
    if cur and string.sub(cur, 1, #ARGV[3]) == ARGV[3] then out[i] = 2 else out[i] = 0 end
  end
end
return out
"""
# claims whose records Kafka refused: those tickets were never submitted
_UNCLAIM = """
for i, k in ipairs(KEYS) do
  local cur = redis.call('GET', k)
  if cur and string.sub(cur, 1, #ARGV[1]) == ARGV[1]
     and redis.call('EXISTS', k .. ':out') == 0 then
    redis.call('DEL', k)
  end
end
return 0
"""
# KEYS[1] the claim, KEYS[2] its outcome; ARGV[1] the rank, ARGV[2] "rank SEP JSON"
_OUTCOME = """
local ttl = redis.call('PTTL', KEYS[1])
if ttl <= 0 then return 0 end
local cur = redis.call('GET', KEYS[2])
if cur and tonumber(ARGV[1]) < tonumber(string.sub(cur, 1, 1)) then return 0 end
redis.call('SET', KEYS[2], ARGV[2], 'PX', ttl)
return 1
"""


def outcome_status(route: str, degraded: bool) -> str:
    if route == REVIEW_ROUTE:
        return "awaiting_review"
    return "degraded" if degraded else "completed"


def topic_pattern(prefix: str) -> str:
    """librdkafka's subscription regex for every result topic under `prefix`."""
    escaped = "".join("\\" + c if c in _REGEX_SPECIAL else c for c in prefix)
    return f"^{escaped}tickets\\.out\\..*"


class TicketIndex:
    """Claims (`ticket:<id>`, a string set if absent) and outcomes (`ticket:<id>:out`):
    one command per ticket to claim, one round trip to read both."""

    def __init__(self, redis_client: Redis | MuxRedis, prefix: str, ttl_s: int) -> None:
        self.redis = redis_client
        self.prefix = prefix + "ticket:"
        self.ttl_ms = ttl_s * 1000
        self._claim = redis_client.register_script(_CLAIM)
        self._unclaim = redis_client.register_script(_UNCLAIM)

    def key(self, ticket_id: str) -> str:
        return self.prefix + ticket_id

    async def claim(self, ticket_ids: list[str], owner: str, trace: str) -> list[int]:
        submitted_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        keys = [self.key(t) for t in ticket_ids]
        value = SEP.join((owner, submitted_at, trace))
        raw = await self._claim(keys=keys, args=[value, self.ttl_ms, owner + SEP])
        return [int(x) for x in raw]

    async def unclaim(self, ticket_ids: list[str], owner: str) -> None:
        if ticket_ids:
            await self._unclaim(keys=[self.key(t) for t in ticket_ids], args=[owner + SEP])

    async def get(self, ticket_id: str) -> dict[str, str] | None:
        """The claim's and the outcome's fields, or None for a ticket never claimed."""
        key = self.key(ticket_id)
        claim, outcome = await self.redis.mget([key, key + ":out"])
        if claim is None:
            return None
        entry = dict(
            zip(("owner", "submitted_at", "trace_id"), as_text(claim).split(SEP), strict=False)
        )
        if outcome is not None:
            entry.update(orjson.loads(as_text(outcome).split(SEP, 1)[1]))
        return entry


def outcome_value(o: Outcome) -> tuple[int, str]:
    """The rank and stored form of an outcome."""
    fields = {
        "status": o.status,
        "route": o.route,
        "error_class": o.error_class,
        "result": o.result.decode(),
    }
    rank = RANKS[o.status]
    return rank, f"{rank}{SEP}{orjson.dumps(fields).decode()}"


def ticket_view(ticket_id: str, entry: dict[str, str], live: dict[str, Any] | None) -> dict:
    """The body of `GET /v1/tickets/{id}` from the index entry and the worker's live state."""
    status = entry.get("status", "accepted")
    step = None
    if (
        status not in TERMINAL
        and live is not None
        and live.get("status") in (LIVE_STATUSES | TERMINAL)
    ):
        status, step = live["status"], live.get("step")
    result = orjson.loads(entry["result"]) if entry.get("result") else None
    return {
        "ticket_id": ticket_id,
        "status": status,
        "step": step if isinstance(step, str) else None,
        "route": entry.get("route") or None,
        "submitted_at": entry.get("submitted_at"),
        "trace_id": entry.get("trace_id"),
        "error_class": entry.get("error_class") or None,
        "result": result,
    }


@dataclass(frozen=True)
class Outcome:
    ticket_id: str
    status: str
    route: str
    result: bytes
    error_class: str


def read_outcome(msg: Message, topics: Topics) -> Outcome | None:
    """A result or dead letter as an index update, or None for a record that is neither."""
    key = msg.key()
    if not key:
        return None
    ticket_id = as_text(key, "replace")
    if msg.topic() == topics.dlq:
        headers = dict(msg.headers() or [])
        error_class = as_text(headers.get("x-dlq-error-class") or b"", "replace")
        return Outcome(ticket_id, "dead_lettered", "", b"", error_class[:64])
    route = (msg.topic() or "").removeprefix(topics.out(""))
    try:
        result = TicketResult.model_validate_json(msg.value() or b"")
    except ValidationError:
        return None
    if result.ticket_id != ticket_id:
        return None
    status = outcome_status(route, result.degraded)
    return Outcome(ticket_id, status, route, result.model_dump_json().encode(), "")


class ResultIndexer:
    """A thread consuming the result topics and the DLQ into the index (at least once)."""

    def __init__(
        self,
        kafka: Mapping[str, Any],
        topics: Topics,
        redis_url: Target,
        prefix: str,
        **config: Any,
    ) -> None:
        self.topics = topics
        self.prefix = prefix + "ticket:"
        self._redis = sync_client(redis_url, socket_timeout=5)
        self._outcome = self._redis.register_script(_OUTCOME)
        self._consumer = Consumer(
            {
                **kafka,
                # one group for every ingest instance: each record is indexed once
                "group.id": f"{topics.prefix}ticketflow-ingest-index",
                "isolation.level": "read_committed",
                "auto.offset.reset": "earliest",
                "enable.auto.offset.store": False,
                # new route topics are found within seconds, not librdkafka's 5 minutes
                "topic.metadata.refresh.interval.ms": 5000,
                **config,
            }
        )
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ingest-indexer", daemon=True)

    def start(self) -> None:
        self._consumer.subscribe([topic_pattern(self.topics.prefix), self.topics.dlq])
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self._consumer.close()
        self._redis.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                msgs = self._consumer.consume(num_messages=500, timeout=0.5)
            except KafkaException as exc:
                log.warning("indexer: %s", exc)
                time.sleep(1)
                continue
            msgs = [m for m in msgs if m.error() is None]
            if msgs:
                self._write(msgs)

    def _write(self, msgs: list[Message]) -> None:
        outcomes = [o for o in (read_outcome(m, self.topics) for m in msgs) if o is not None]
        while not self._stop.is_set():
            try:
                pipe = self._redis.pipeline(transaction=False)
                for o in outcomes:
                    key = self.prefix + o.ticket_id
                    rank, value = outcome_value(o)
                    self._outcome(keys=[key, key + ":out"], args=[rank, value], client=pipe)
                pipe.execute()
                break
            except redis.RedisError as exc:  # kept until Redis is back: nothing is skipped
                log.warning("indexer: Redis: %s; retrying", type(exc).__name__)
                time.sleep(1)
        last: dict[tuple[str, int], int] = {}
        for m in msgs:
            topic, partition, offset = m.topic(), m.partition(), m.offset()
            if topic is not None and partition is not None and offset is not None:
                last[(topic, partition)] = offset
        self._consumer.store_offsets(
            offsets=[TopicPartition(t, p, o + 1) for (t, p), o in last.items()]
        )
