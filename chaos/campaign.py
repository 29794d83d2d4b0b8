"""`ticketflow chaos`: a fault campaign in the manner of Kafka's system tests and Jepsen.

Each round runs its own workers on a fresh topic prefix, publishes valid tickets at a steady
rate (plus a few hostile records) with a stock confluent-kafka producer, and injects a seeded
random schedule of faults: workers SIGKILLed or frozen past their session timeout, the broker
killed or restarted, Triton, Redis and the gateway killed and brought back. Then it stops
publishing, lets the pipeline drain and checks, as a read_committed consumer would see it,
that every valid ticket has exactly one result and every hostile record is dead-lettered.
A JSON report and a PNG go to --out; see docs/chaos.md.

The pure parts (the schedule, the counting, the report) come first and are unit-tested; the
campaign itself (`Campaign`) drives real processes.
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
import json
import random
import signal
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from statistics import median
from typing import Any

import orjson
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from rich.console import Console

from streams.admin import delete_prefixed
from streams.kafka_config import confluent_config
from streams.settings import Settings
from streams.topics import Topics
from streams.watermarks import watermarks
from ticketflow import services, stack
from ticketflow.stack.process import log_tail

console = Console()

FAULT_KINDS: tuple[str, ...] = (
    "worker_kill",  # SIGKILL one worker, restart it after the hold
    "workers_kill",  # SIGKILL every worker at once, restart them all
    "worker_pause",  # SIGSTOP one worker past its session timeout, then SIGCONT: a zombie
    "broker_kill",  # SIGKILL the broker (no clean shutdown), start it again
    "broker_restart",  # SIGTERM the broker (clean shutdown), start it again
    "triton_kill",
    "redis_kill",
    "gateway_kill",
)
# how long a fault holds before it is healed, (min, max) seconds
HOLD_S: dict[str, tuple[float, float]] = {
    "worker_kill": (1.0, 5.0),
    "workers_kill": (1.0, 5.0),
    # Faust's session timeout is 6 s (streams/app.py): frozen for longer, the group moves
    # the worker's partitions on while it still believes it owns them
    "worker_pause": (9.0, 12.0),
    "broker_kill": (1.0, 5.0),
    "broker_restart": (1.0, 5.0),
    # long enough for the worker's breaker to see its 10 s window of errors
    "triton_kill": (5.0, 15.0),
    "redis_kill": (3.0, 10.0),
    "gateway_kill": (3.0, 10.0),
}
WORKER_FAULTS = frozenset({"worker_kill", "worker_pause"})  # those with one target
STACK_PARTS = {
    "broker_kill": "kafka",
    "broker_restart": "kafka",
    "triton_kill": "triton",
    "redis_kill": "redis",
}
HOSTILE_KINDS: tuple[str, ...] = (
    "bad_json",
    "not_utf8",
    "schema",
    "too_large",
    "bad_replay_count",  # not JSON, and an x-replay-count of 'abc'
    "bad_header_bytes",  # not JSON, and headers that are not UTF-8
)
ROUTES = ("auto_classify", "manual_review", "after_sales")
SAMPLE = 20  # ids listed in the report per kind of problem
AFTER_HEALED_S = 10.0  # how long after a fault is healed its stall is still looked for


# ---- the schedule -----------------------------------------------------------------------------


@dataclass(frozen=True)
class FaultPlan:
    kind: str
    at_s: float  # from the start of publishing
    hold_s: float  # how long before it is healed
    target: int | None = None  # the worker, for a fault on one worker


@dataclass(frozen=True)
class RoundPlan:
    index: int
    seed: int
    static_members: bool  # workers get TICKETFLOW_WORKER_ID (static group membership)
    faults: tuple[FaultPlan, ...]
    hostile: tuple[tuple[float, str], ...]  # (at_s, kind)


def parse_faults(text: str | None) -> tuple[str, ...]:
    """The fault kinds of a comma list; every kind when empty. Unknown names are refused."""
    names = [n.strip() for n in (text or "").split(",") if n.strip()]
    unknown = sorted(set(names) - set(FAULT_KINDS))
    if unknown:
        raise ValueError(f"unknown fault(s) {', '.join(unknown)}; known: {', '.join(FAULT_KINDS)}")
    return tuple(dict.fromkeys(names)) or FAULT_KINDS


def parse_hostile(text: str | None) -> tuple[str, ...]:
    """The hostile record kinds of a comma list: every kind when empty, none for `none`."""
    if (text or "").strip().lower() == "none":
        return ()
    names = [n.strip() for n in (text or "").split(",") if n.strip()]
    unknown = sorted(set(names) - set(HOSTILE_KINDS))
    if unknown:
        known = ", ".join(HOSTILE_KINDS)
        raise ValueError(f"unknown hostile kind(s) {', '.join(unknown)}; known: {known}, none")
    return tuple(dict.fromkeys(names)) or HOSTILE_KINDS


def round_seed(seed: int, index: int) -> int:
    # an int, not a string: str hashes are salted per process and would break replays
    return seed * 1_000_003 + index


def max_faults(round_s: float) -> int:
    """One fault per 20 s of round, 1 to 3: each needs time to heal and to be seen healed."""
    return max(1, min(3, int(round_s // 20)))


def draw_round(
    seed: int,
    index: int,
    round_s: float,
    workers: int,
    allowed: Sequence[str],
    hostile_kinds: Sequence[str] = HOSTILE_KINDS,
) -> RoundPlan:
    """A round's faults, one after another in the first 3/4 of the round, and its hostiles.

    Every hostile kind gets its time drawn, even those left out: the faults of a seed are
    the same whichever hostile records go with them."""
    rs = round_seed(seed, index)
    rng = random.Random(rs)
    n = rng.randint(1, max_faults(round_s))
    start, end = max(3.0, 0.15 * round_s), 0.75 * round_s
    slot = (end - start) / n
    faults = []
    for i in range(n):
        kind = rng.choice(list(allowed))
        at = start + i * slot + rng.uniform(0, slot / 2)
        hold = rng.uniform(*HOLD_S[kind])
        target = rng.randrange(workers) if kind in WORKER_FAULTS else None
        faults.append(FaultPlan(kind, round(at, 1), round(hold, 1), target))
    times = [(round(rng.uniform(0.05, 0.95) * round_s, 1), k) for k in HOSTILE_KINDS]
    hostile = sorted((at, k) for at, k in times if k in hostile_kinds)
    static = rng.random() < 0.5
    return RoundPlan(index, rs, static, tuple(faults), tuple(hostile))


def draw_campaign(
    seed: int,
    rounds: int,
    round_s: float,
    workers: int,
    allowed: Sequence[str],
    hostile_kinds: Sequence[str] = HOSTILE_KINDS,
) -> list[RoundPlan]:
    return [
        draw_round(seed, i, round_s, workers, allowed, hostile_kinds) for i in range(1, rounds + 1)
    ]


# ---- checks -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tally:
    """Results counted against what was published."""

    lost: list[str]  # published, no result
    doubled: dict[str, int]  # more than one result
    unexpected: list[str]  # a result for a ticket never (knowingly) published

    @property
    def exact(self) -> bool:
        return not self.lost and not self.doubled


def check_exactly_once(
    expected: Iterable[str], result_keys: Iterable[str], maybe: Iterable[str] = ()
) -> Tally:
    """Exactly one result per expected ticket id; `maybe` are ids whose publish is unknown
    (no delivery report), whose results are neither required nor unexpected."""
    counts = Counter(result_keys)
    wanted = set(expected)
    lost = sorted(wanted - set(counts))
    doubled = {k: n for k, n in sorted(counts.items()) if n > 1}
    unexpected = sorted(set(counts) - wanted - set(maybe))
    return Tally(lost, doubled, unexpected)


def time_to_flow(times: Sequence[float], healed_at: float) -> float | None:
    """Seconds from `healed_at` to the first result seen after it (None: none came)."""
    i = bisect.bisect_left(times, healed_at)
    return None if i == len(times) else round(times[i] - healed_at, 2)


def longest_stall(times: Sequence[float], start: float, end: float) -> float:
    """The longest time without a result within [start, end] (`times` sorted)."""
    inside = [t for t in times[bisect.bisect_left(times, start) :] if t <= end]
    edges = [start, *inside, end]
    return round(max(b - a for a, b in itertools.pairwise(edges)), 2)


def per_second(times: Iterable[float], t0: float, seconds: int) -> list[int]:
    """Results per second since `t0`, for the flow plot."""
    counts = [0] * max(seconds, 0)
    for t in times:
        i = int(t - t0)
        if 0 <= i < len(counts):
            counts[i] += 1
    return counts


# ---- the report -------------------------------------------------------------------------------


@dataclass
class FaultRecord:
    kind: str
    target: int | None
    planned_at_s: float
    hold_s: float
    started_at_s: float | None = None  # when it was injected
    ended_at_s: float | None = None  # when healing began (restart, SIGCONT)
    healthy_at_s: float | None = None  # when the healed part answered again
    time_to_flow_s: float | None = None  # first result after ended_at_s
    stall_s: float | None = None  # longest time without results, start to 10 s after healthy
    note: str = ""  # skipped, or what went wrong while injecting or healing


@dataclass
class RoundReport:
    index: int
    seed: int
    prefix: str
    static_members: bool
    faults: list[FaultRecord] = field(default_factory=list)
    published: int = 0
    publish_failed: int = 0
    results: int = 0
    lost: int = 0
    doubled: int = 0
    lost_ids: list[str] = field(default_factory=list)
    doubled_ids: dict[str, int] = field(default_factory=dict)
    # lost tickets found dead-lettered: "<class> at <step>: <reason>" -> tickets
    lost_in_dlq: dict[str, int] = field(default_factory=dict)
    dlq_duplicates: int = 0  # dead letters beyond the first for the same key
    unexpected: int = 0
    dlq_expected: int = 0
    dlq_found: int = 0
    dlq_missing: list[str] = field(default_factory=list)
    dlq_parked: int = 0
    workers_died: list[dict[str, Any]] = field(default_factory=list)
    drained: bool = False
    drain_s: float = 0.0
    duration_s: float = 0.0
    flow_per_s: list[int] = field(default_factory=list)
    where_lost: dict[str, dict[str, int]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    logs: list[str] = field(default_factory=list)

    def problems(self) -> list[str]:
        out = [f"{self.lost} lost"] if self.lost else []
        out += [f"{self.doubled} doubled"] if self.doubled else []
        out += [f"{len(self.dlq_missing)} hostile not in the DLQ"] if self.dlq_missing else []
        out += [f"{w['worker']} died (rc {w['rc']})" for w in self.workers_died]
        out += [] if self.drained else [f"not drained in {self.drain_s:.0f} s"]
        return out + self.errors

    @property
    def exact(self) -> bool:
        return not self.problems()

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "exact": self.exact, "problems": self.problems()}


def summarize(rounds: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Totals over the rounds, and time to flow again per fault kind."""
    ttf: dict[str, list[float]] = {}
    never = 0
    for r in rounds:
        for f in r["faults"]:
            if f["ended_at_s"] is None:
                continue
            if f["time_to_flow_s"] is None:
                never += 1
            else:
                ttf.setdefault(f["kind"], []).append(f["time_to_flow_s"])
    return {
        "rounds": len(rounds),
        "exact_rounds": sum(1 for r in rounds if r["exact"]),
        "published": sum(r["published"] for r in rounds),
        "lost": sum(r["lost"] for r in rounds),
        "doubled": sum(r["doubled"] for r in rounds),
        "dlq_missing": sum(len(r["dlq_missing"]) for r in rounds),
        "workers_died": sum(len(r["workers_died"]) for r in rounds),
        "faults": sum(len(r["faults"]) for r in rounds),
        "never_flowed_again": never,
        "time_to_flow_s": {
            k: {"n": len(v), "median": round(median(v), 2), "max": max(v)}
            for k, v in sorted(ttf.items())
        },
    }


def round_line(r: dict[str, Any], total: int) -> str:
    """The one terminal line per round."""
    faults = ", ".join(_fault_text(f) for f in r["faults"]) or "none"
    verdict = "[green]exact[/]" if r["exact"] else f"[red]NOT exact: {'; '.join(r['problems'])}[/]"
    return (
        f"round {r['index']}/{total} seed {r['seed']}: {faults} | published {r['published']}, "
        f"results {r['results']}, lost {r['lost']}, doubled {r['doubled']}, "
        f"dlq {r['dlq_found']}/{r['dlq_expected']} | {verdict}"
    )


def _fault_text(f: dict[str, Any]) -> str:
    who = "" if f["target"] is None else f"#{f['target']}"
    at = "?" if f["started_at_s"] is None else f"{f['started_at_s']:.0f}"
    ttf = f["time_to_flow_s"]
    flow = "no flow" if ttf is None else f"flow in {ttf:.1f}s"
    return f"{f['kind']}{who}@{at}s ({f['note'] or flow})"


def write_report(report: dict[str, Any], out: Path) -> tuple[Path, Path]:
    """chaos.json and chaos.png in `out`."""
    from chaos.plot import plot

    out.mkdir(parents=True, exist_ok=True)
    path = out / "chaos.json"
    path.write_text(json.dumps(report, indent=1) + "\n")
    png = out / "chaos.png"
    plot(report, png)
    return path, png


# ---- traffic ----------------------------------------------------------------------------------


def hostile_record(kind: str, key: str) -> tuple[bytes, list[tuple[str, bytes]] | None]:
    """(value, headers) of a record `validate` must dead-letter."""
    broken = b'{"ticket_id": "' + key.encode() + b'", "text": '  # cut off mid-object
    if kind == "bad_json":
        return broken, None
    if kind == "not_utf8":
        return b"\xff\xfe\xfa not utf-8 \xc3\x28", None
    if kind == "schema":  # well-formed JSON, but the text is empty and the date is not one
        return orjson.dumps({"ticket_id": key, "text": "", "created_at": "yesterday"}), None
    if kind == "too_large":
        return orjson.dumps({"ticket_id": key, "text": "x" * 70_000, "created_at": _now()}), None
    if kind == "bad_replay_count":
        return broken, [("x-replay-count", b"abc")]
    if kind == "bad_header_bytes":
        return broken, [("traceparent", b"\xff\xfe\x00"), ("x-replay-count", b"\xc3\x28")]
    raise ValueError(f"unknown hostile kind {kind!r}")


def _now() -> str:
    return datetime.now(timezone.utc).isoformat()


class Traffic(threading.Thread):
    """A stock producer: valid tickets at a steady rate, hostile records at their times."""

    def __init__(
        self,
        kafka: Mapping[str, Any],
        topic: str,
        tag: str,
        rate: float,
        hostile: Sequence[tuple[float, str]],
        texts: Sequence[str],
    ) -> None:
        super().__init__(name=f"chaos-traffic-{tag}", daemon=True)
        # defaults as a user's client would have them: no idempotence, librdkafka's partitioner
        # log_level 0: librdkafka's reconnect lines through a broker outage are expected
        self.producer = Producer({**kafka, "linger.ms": 5, "log_level": 0})
        self.topic, self.tag, self.rate, self.texts = topic, tag, rate, texts
        self.pending = list(hostile)
        self.sent: list[str] = []
        self.acked: set[str] = set()
        self.failed: dict[str, str] = {}
        self.hostile_sent: dict[str, str] = {}  # key -> kind
        self.halt = threading.Event()

    def run(self) -> None:
        start, n = time.monotonic(), 0
        while not self.halt.is_set():
            elapsed = time.monotonic() - start
            while self.pending and self.pending[0][0] <= elapsed:
                self._hostile(self.pending.pop(0)[1])
            if n / self.rate > elapsed:
                self.halt.wait(min(n / self.rate - elapsed, 0.05))
                self.producer.poll(0)
                continue
            self._ticket(n)
            n += 1
        for _, kind in self.pending:  # a round cut short: every planned hostile is checked
            self._hostile(kind)
        self.producer.flush(120)

    def _ticket(self, n: int) -> None:
        tid = f"{self.tag}-{n}"
        value = orjson.dumps(
            {
                "ticket_id": tid,
                "text": self.texts[n % len(self.texts)],
                "user_id": f"u{n % 50}",
                "channel": "email",
                "created_at": _now(),
            }
        )
        self._produce(tid, value, None)
        self.sent.append(tid)

    def _hostile(self, kind: str) -> None:
        key = f"{self.tag}-hostile-{kind}"
        value, headers = hostile_record(kind, key)
        self._produce(key, value, headers)
        self.hostile_sent[key] = kind

    def _produce(self, key: str, value: bytes, headers: list | None) -> None:
        def on_delivery(err, _msg) -> None:
            if err is None:
                self.acked.add(key)
            else:
                self.failed[key] = str(err)

        while True:
            try:
                self.producer.produce(
                    self.topic,
                    key=key.encode(),
                    value=value,
                    headers=headers,
                    on_delivery=on_delivery,
                )
                break
            except BufferError:  # the local queue is full (a long broker outage): wait
                self.producer.poll(0.1)
        self.producer.poll(0)


@dataclass(frozen=True)
class Seen:
    topic: str
    key: str
    at: float  # wall clock when this read_committed consumer got it
    dead_letter: str = ""  # for a dead letter: "<class> at <step>: <reason>"


class Watcher(threading.Thread):
    """A read_committed consumer of the result and dead-letter topics, from their start.

    Partitions are assigned, not subscribed: no group to rejoin after a broker restart.
    """

    def __init__(self, kafka: Mapping[str, Any], topics: Sequence[str]) -> None:
        super().__init__(name="chaos-watcher", daemon=True)
        self.consumer = Consumer(
            {
                **kafka,
                "group.id": f"chaos-watch-{uuid.uuid4().hex[:8]}",
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "log_level": 0,
            }
        )
        parts = []
        for topic in topics:
            meta = self.consumer.list_topics(topic, timeout=30).topics[topic]
            parts += [TopicPartition(topic, p, OFFSET_BEGINNING) for p in meta.partitions]
        self.consumer.assign(parts)
        self.halt = threading.Event()
        self._seen: list[Seen] = []
        self._lock = threading.Lock()

    def run(self) -> None:
        try:
            while not self.halt.is_set():
                for msg in self.consumer.consume(500, 0.2):
                    if not msg.error():
                        self._keep(msg)
        finally:
            self.consumer.close()

    def _keep(self, msg) -> None:
        h = {k: (v or b"").decode("utf-8", "replace") for k, v in msg.headers() or []}
        why = ""
        if "x-dlq-error-class" in h:
            reason = h.get("x-dlq-reason", "").splitlines()[0][:80] if h.get("x-dlq-reason") else ""
            why = f"{h['x-dlq-error-class']} at {h.get('x-dlq-step', '?')}: {reason}"
        key = (msg.key() or b"").decode("utf-8", "replace")
        with self._lock:
            self._seen.append(Seen(msg.topic(), key, time.time(), why))

    def seen(self) -> list[Seen]:
        with self._lock:
            return list(self._seen)


def locate(
    kafka: Mapping[str, Any], prefix: str, keys: set[str], timeout_s: float = 60
) -> dict[str, dict[str, int]]:
    """How many records keyed by each of `keys` every topic under `prefix` holds (read
    uncommitted, so an aborted result counts too): where a lost ticket got to."""
    c = Consumer(
        {
            **kafka,
            "group.id": f"chaos-locate-{uuid.uuid4().hex[:8]}",
            "isolation.level": "read_uncommitted",
            "enable.auto.commit": False,
            "log_level": 0,
        }
    )
    found: dict[str, Counter[str]] = {k: Counter() for k in keys}
    deadline = time.monotonic() + timeout_s
    try:
        meta = c.list_topics(timeout=10).topics
        ends = {
            TopicPartition(t, p): watermarks(c, TopicPartition(t, p))[1]
            for t in meta
            if t.startswith(prefix)
            for p in meta[t].partitions
        }
        todo = {(tp.topic, tp.partition): high for tp, high in ends.items() if high > 0}
        c.assign([TopicPartition(t, p, OFFSET_BEGINNING) for t, p in todo])
        while todo and time.monotonic() < deadline:
            for msg in c.consume(5000, 0.5):
                key = None if msg.error() else (msg.key() or b"").decode("utf-8", "replace")
                if key in found:
                    found[key][msg.topic().removeprefix(prefix)] += 1
            # the position, not the last record: it also steps over a closing txn marker
            for tp in c.position([TopicPartition(t, p) for t, p in todo]):
                if tp.offset >= todo[(tp.topic, tp.partition)]:
                    del todo[(tp.topic, tp.partition)]
    finally:
        c.close()
    return {k: dict(v) for k, v in found.items()}


# ---- the campaign -----------------------------------------------------------------------------


class ChaosError(RuntimeError):
    """The campaign cannot run (the stack is not up)."""


@dataclass(frozen=True)
class Options:
    rounds: int = 5
    workers: int = 2
    rate: float = 100.0  # valid tickets a second
    round_s: float = 60.0  # publishing time of a round (longer when its faults run over)
    seed: int = 0
    faults: tuple[str, ...] = FAULT_KINDS
    hostile: tuple[str, ...] = HOSTILE_KINDS
    drain_s: float = 120.0  # the most a round waits for its results once publishing stops
    settle_s: float = 5.0  # then this long for duplicates to show
    tail_s: float = 5.0  # publishing goes on at least this long after the last fault healed
    ready_s: float = 90.0  # the most a (re)started worker or gateway may take to serve


def child_env(s: Settings) -> dict[str, str]:
    """The settings a worker or gateway child must share with the campaign."""
    env = {
        "TICKETFLOW_KAFKA_BOOTSTRAP": s.kafka_bootstrap,
        "TICKETFLOW_TOPIC_PREFIX": s.topic_prefix,
        "TICKETFLOW_PARTITIONS": str(s.partitions),
        "TICKETFLOW_REDIS_URL": s.redis_url.get_secret_value(),
        "TICKETFLOW_TRITON_GRPC": s.triton_grpc,
        "TICKETFLOW_GATEWAY_URL": s.gateway_url,
        "TICKETFLOW_STATE_DIR": str(s.state_dir),
        "TICKETFLOW_WORKER_WEB_PORT": str(s.worker_web_port),
    }
    if s.redis_ca_file:
        env["TICKETFLOW_REDIS_CA_FILE"] = str(s.redis_ca_file)
    if s.worker_id:
        env["TICKETFLOW_WORKER_ID"] = s.worker_id
    return env


@dataclass
class Child:
    """A worker or the gateway: a process of the campaign's own, killed, frozen, restarted."""

    name: str
    settings: Settings
    args: list[str]
    ready: Callable[[], bool]
    service: services.Service | None = None
    down: bool = False  # killed by us and not started again yet

    def spawn(self) -> None:
        env = child_env(self.settings)
        self.service = services.start(self.name, self.args, self.settings, env, self.name)
        self.down = False

    def await_ready(self, timeout_s: float) -> None:
        assert self.service is not None
        services.wait_until(self.ready, self.service, timeout_s, "ready")

    def kill(self) -> None:
        self.down = True
        if self.service is not None:
            self.service.kill()

    def signal(self, sig: int) -> None:
        if self.service is not None and self.service.process.poll() is None:
            self.service.process.send_signal(sig)

    def exit_code(self) -> int | None:
        """The exit code of a process that ended without our kill; None while it runs."""
        if self.down or self.service is None:
            return None
        return self.service.process.poll()

    def stop(self) -> None:
        self.signal(signal.SIGCONT)  # a frozen process must wake to see its SIGTERM
        if self.service is not None:
            self.service.stop()


def _spawn_all(children: Sequence[Child], timeout_s: float) -> None:
    """Start side by side, then wait for each: a restart of all is one start-up, not N."""
    for child in children:
        child.spawn()
    for child in children:
        child.await_ready(timeout_s)


class Campaign:
    """Runs the rounds of `options` against the stack of `settings`; `report()` says how."""

    def __init__(
        self,
        settings: Settings,
        options: Options,
        on_round: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.s, self.o, self.on_round = settings, options, on_round
        self.run_id = uuid.uuid4().hex[:6]
        o = options
        self.plans = draw_campaign(o.seed, o.rounds, o.round_s, o.workers, o.faults, o.hostile)
        self.rounds: list[dict[str, Any]] = []
        self.started_at = _now()
        self.down_parts: set[str] = set()
        self.gateway: Child | None = None
        self.workers: list[Child] = []
        self.current = RoundReport(0, 0, "", False)
        self.t0 = time.time()
        self.published_until = self.t0

    def run(self) -> dict[str, Any]:
        self._check_stack()
        try:
            self.gateway = self._gateway_child()
            _spawn_all([self.gateway], self.o.ready_s)
            for plan in self.plans:
                result = self._round(plan).to_dict()
                self.rounds.append(result)
                if self.on_round:
                    self.on_round(result)
        finally:
            self.restore()
            if self.gateway is not None:
                self.gateway.stop()
        return self.report()

    def report(self) -> dict[str, Any]:
        o = self.o
        return {
            "campaign": {
                "started_at": self.started_at,
                "seed": o.seed,
                "rounds": o.rounds,
                "workers": o.workers,
                "rate": o.rate,
                "round_s": o.round_s,
                "faults": list(o.faults),
                "hostile": list(o.hostile),
                "kafka": self.s.kafka_bootstrap,
                "state_dir": str(self.s.state_dir),
            },
            "rounds": self.rounds,
            "summary": summarize(self.rounds),
        }

    # ---- stack and children -------------------------------------------------------------------

    def _check_stack(self) -> None:
        down = [p.name for p in stack.status(self.s) if not p.healthy]
        if down:
            raise ChaosError(f"{', '.join(down)} not up; run `ticketflow stack up` first")

    def _gateway_child(self) -> Child:
        url = f"http://127.0.0.1:{services.free_port()}"
        gs = self.s.model_copy(update={"gateway_url": url})
        return Child(
            f"chaos-{self.run_id}-gateway", gs, ["gateway"], lambda: services.gateway_ready(gs)
        )

    def _worker_child(self, rs: Settings, index: int, i: int, static: bool) -> Child:
        assert self.gateway is not None
        ws = rs.model_copy(
            update={
                "worker_web_port": services.free_port(),
                "gateway_url": self.gateway.settings.gateway_url,
                "worker_id": f"w{i}" if static else None,
            }
        )
        name = f"chaos-{self.run_id}-r{index}-w{i}"
        # one process: a kill or freeze of the child is then one of a worker
        args = ["worker", "--loglevel", "warning", "--processes", "1"]
        return Child(name, ws, args, lambda: services.worker_ready(ws))

    def restore(self) -> None:
        """Every stack part we stopped is started again, every child of ours runs again."""
        for part in [p for p in stack.PARTS if p in self.down_parts]:
            for attempt in (1, 2):
                try:
                    stack.start_part(self.s, part)
                    self.down_parts.discard(part)
                    break
                except stack.StackError as exc:
                    self.current.errors.append(f"restoring {part} (try {attempt}): {exc}"[:500])
        for child in [c for c in [self.gateway, *self.workers] if c is not None and c.down]:
            try:
                _spawn_all([child], self.o.ready_s)
            except (RuntimeError, TimeoutError) as exc:
                self.current.errors.append(f"restarting {child.name}: {exc}"[:500])
        for child in self.workers:
            child.signal(signal.SIGCONT)

    def _supervise(self) -> None:
        """A child that exited without our kill is reported, and started again as a
        supervisor would, so that the round's counts still mean something."""
        for child in [self.gateway, *self.workers]:
            rc = None if child is None else child.exit_code()
            if child is None or rc is None:
                continue
            assert child.service is not None
            self.current.workers_died.append(
                {
                    "worker": child.name,
                    "at_s": self._at(),
                    "rc": rc,
                    "log": str(child.service.log_path),
                    "tail": log_tail(child.service.log_path, 10),
                }
            )
            child.spawn()

    def _at(self) -> float:
        return round(time.time() - self.t0, 2)

    def _sleep_until(self, wall: float) -> None:
        while (left := wall - time.time()) > 0:
            time.sleep(min(left, 0.5))
            self._supervise()

    # ---- a round ------------------------------------------------------------------------------

    def _round(self, plan: RoundPlan) -> RoundReport:
        prefix = f"{self.base_prefix}r{plan.index}."
        report = self.current = RoundReport(plan.index, plan.seed, prefix, plan.static_members)
        rs = self.s.model_copy(update={"topic_prefix": prefix})
        began = time.time()
        self.workers = [
            self._worker_child(rs, plan.index, i, plan.static_members)
            for i in range(self.o.workers)
        ]
        report.logs = [str(self.s.state_dir / "logs" / f"{w.name}.log") for w in self.workers]
        traffic: Traffic | None = None
        watcher: Watcher | None = None
        try:
            _spawn_all(self.workers, self.o.ready_s)
            topics = Topics(prefix)
            watcher = Watcher(confluent_config(rs), _watched(topics))
            watcher.start()
            traffic = Traffic(
                confluent_config(rs), topics.tickets_in, f"r{plan.index}", self.o.rate,
                plan.hostile, _texts(plan.seed),
            )  # fmt: skip
            self.t0 = time.time()
            traffic.start()
            self._play(plan.faults)
            _finish(traffic)
            self.published_until = time.time()
            self._drain(traffic, watcher)
            self._check_alive()
            _finish(watcher)
            self._check(report, traffic, watcher.seen(), rs)
        except Exception as exc:  # reported as the round's failure; the campaign goes on
            report.errors.append(f"{type(exc).__name__}: {exc}"[:500])
        finally:
            for thread in (traffic, watcher):
                if thread is not None and thread.is_alive():
                    _finish(thread)
            self.restore()
            for w in self.workers:
                w.stop()
            report.duration_s = round(time.time() - began, 1)
        if report.exact:  # a failed round's topics stay for a post-mortem
            with contextlib.suppress(Exception):
                delete_prefixed(self.s, prefix, prefix)
        return report

    @property
    def base_prefix(self) -> str:
        return f"{self.s.topic_prefix}chaos{self.run_id}"

    def _play(self, faults: Sequence[FaultPlan]) -> None:
        """The faults one after another, then publishing for the rest of the round."""
        last = 0.0
        for plan in faults:
            self._sleep_until(self.t0 + max(plan.at_s, last))
            record = self._fault(plan)
            self.current.faults.append(record)
            last = record.healthy_at_s or self._at()
        self._sleep_until(self.t0 + max(self.o.round_s, last + self.o.tail_s))

    def _fault(self, plan: FaultPlan) -> FaultRecord:
        record = FaultRecord(plan.kind, plan.target, plan.at_s, plan.hold_s)
        part = STACK_PARTS.get(plan.kind)
        if part and not stack.part_status(self.s, part).ours:
            record.note = f"skipped: {part} was not started by `ticketflow stack up` here"
            return record
        record.started_at_s = self._at()
        try:
            self._inject(plan)
            self._sleep_until(time.time() + plan.hold_s)
            record.ended_at_s = self._at()
            self._heal(plan)
            record.healthy_at_s = self._at()
        except Exception as exc:
            record.note = f"{type(exc).__name__}: {exc}"[:300]
            self.current.errors.append(f"{plan.kind}: {record.note}")
            self.restore()
        return record

    def _inject(self, plan: FaultPlan) -> None:
        kind = plan.kind
        if kind in STACK_PARTS:
            part = STACK_PARTS[kind]
            self.down_parts.add(part)
            # broker_restart is the clean shutdown; every other part is SIGKILLed
            if not stack.stop_part(self.s, part, kill=kind != "broker_restart"):
                raise ChaosError(f"{part} was not running")
        elif kind == "gateway_kill":
            assert self.gateway is not None
            self.gateway.kill()
        elif kind == "workers_kill":
            for w in self.workers:
                w.kill()
        elif kind == "worker_kill":
            self.workers[plan.target or 0].kill()
        elif kind == "worker_pause":
            self.workers[plan.target or 0].signal(signal.SIGSTOP)

    def _heal(self, plan: FaultPlan) -> None:
        kind = plan.kind
        if kind in STACK_PARTS:
            stack.start_part(self.s, STACK_PARTS[kind])
            self.down_parts.discard(STACK_PARTS[kind])
        elif kind == "gateway_kill":
            assert self.gateway is not None
            _spawn_all([self.gateway], self.o.ready_s)
        elif kind == "workers_kill":
            _spawn_all(self.workers, self.o.ready_s)
        elif kind == "worker_kill":
            _spawn_all([self.workers[plan.target or 0]], self.o.ready_s)
        elif kind == "worker_pause":
            worker = self.workers[plan.target or 0]
            worker.signal(signal.SIGCONT)
            # the zombie must find out it was fenced and rejoin the group
            worker.await_ready(self.o.ready_s)

    def _drain(self, traffic: Traffic, watcher: Watcher) -> None:
        """Wait (bounded) for every result and dead letter, then a while for duplicates."""
        expected = {t for t in traffic.sent if t in traffic.acked}
        hostile = {k for k in traffic.hostile_sent if k in traffic.acked}
        topics = Topics(self.current.prefix)
        outs, dlqs = {topics.out(r) for r in ROUTES}, {topics.dlq, topics.dlq_parked}
        start = time.monotonic()
        while time.monotonic() - start < self.o.drain_s:
            seen = watcher.seen()
            results = {x.key for x in seen if x.topic in outs}
            dead = {x.key for x in seen if x.topic in dlqs}
            if expected <= results and hostile <= dead:
                self.current.drained = True
                break
            self._sleep_until(time.time() + 0.5)
        self.current.drain_s = round(time.monotonic() - start, 1)
        self._sleep_until(time.time() + self.o.settle_s)

    def _check_alive(self, timeout_s: float = 30.0) -> None:
        """Every worker must be serving at the end: alive but not ready is a stuck worker
        (a moment of rebalancing is allowed for)."""
        deadline = time.time() + timeout_s
        waiting = list(self.workers)
        while waiting and time.time() < deadline:
            waiting = [w for w in waiting if not w.ready()]
            self._sleep_until(time.time() + 0.5)
        self.current.errors += [f"{w.name} not ready at the end (stuck)" for w in waiting]

    def _check(self, report: RoundReport, traffic: Traffic, seen: list[Seen], rs: Settings) -> None:
        topics = Topics(rs.topic_prefix)
        outs = {topics.out(r) for r in ROUTES}
        results = [x for x in seen if x.topic in outs]
        dead = [x for x in seen if x.topic in (topics.dlq, topics.dlq_parked)]
        expected = [t for t in traffic.sent if t in traffic.acked]
        tally = check_exactly_once(expected, (x.key for x in results), set(traffic.sent))
        lost = set(tally.lost)
        hostile = {k for k in traffic.hostile_sent if k in traffic.acked}
        report.published, report.publish_failed = len(expected), len(traffic.failed)
        report.results, report.unexpected = len(results), len(tally.unexpected)
        report.lost, report.lost_ids = len(tally.lost), tally.lost[:SAMPLE]
        report.doubled = len(tally.doubled)
        report.doubled_ids = dict(list(tally.doubled.items())[:SAMPLE])
        # once per ticket: a redelivered record may be dead-lettered twice
        report.lost_in_dlq = dict(
            Counter({x.key: x.dead_letter for x in dead if x.key in lost}.values())
        )
        report.dlq_duplicates = len(dead) - len({x.key for x in dead})
        report.dlq_expected = len(hostile)
        report.dlq_missing = sorted(hostile - {x.key for x in dead})
        report.dlq_found = len(hostile) - len(report.dlq_missing)
        report.dlq_parked = sum(1 for x in dead if x.topic == topics.dlq_parked)
        times = sorted(x.at for x in results)
        report.flow_per_s = per_second(times, self.t0, int(time.time() - self.t0) + 1)
        for f in report.faults:
            _flow_figures(f, times, self.t0, self.published_until)
        if lost:
            report.where_lost = locate(confluent_config(rs), rs.topic_prefix, set(tally.lost[:3]))


def _flow_figures(f: FaultRecord, times: Sequence[float], t0: float, until: float) -> None:
    if f.started_at_s is None or f.ended_at_s is None:
        return
    f.time_to_flow_s = time_to_flow(times, t0 + f.ended_at_s)
    # a restarted worker's rejoin stops the whole group a while after it is healed: the
    # stall is looked for until AFTER_HEALED_S past healthy, within the publishing time
    healed = f.healthy_at_s if f.healthy_at_s is not None else f.ended_at_s
    end = min(t0 + healed + AFTER_HEALED_S, until)
    f.stall_s = longest_stall(times, t0 + f.started_at_s, max(end, t0 + f.started_at_s))


def _watched(topics: Topics) -> list[str]:
    return [*(topics.out(r) for r in ROUTES), topics.dlq, topics.dlq_parked]


def _texts(seed: int) -> list[str]:
    from inference_gateway.model.corpus import generate

    return [t["text"] for t in generate(300, seed=seed % 100_000)]


def _finish(thread: Traffic | Watcher) -> None:
    thread.halt.set()
    thread.join(180)


# ---- the command ------------------------------------------------------------------------------


def main(settings: Settings, options: Options, out: Path) -> int:
    """Run the campaign, write chaos.json and chaos.png, print a summary; 1 unless exact."""
    console.print(
        f"chaos: {options.rounds} round(s) of {options.round_s:.0f} s, {options.workers} "
        f"workers, {options.rate:.0f} tickets/s, seed {options.seed}, faults "
        f"{','.join(options.faults)}, hostile {','.join(options.hostile) or 'none'}; "
        f"Kafka at {settings.kafka_bootstrap}"
    )
    campaign = Campaign(settings, options, lambda r: console.print(round_line(r, options.rounds)))
    try:
        campaign.run()
    except ChaosError as exc:
        console.print(f"[red]chaos: {exc}[/]")
        return 2
    finally:
        if campaign.rounds:
            json_path, png = write_report(campaign.report(), out)
            console.print(f"report: {json_path}  plot: {png}")
    return _summary(campaign.report())


def _summary(report: dict[str, Any]) -> int:
    s = report["summary"]
    ttf = ", ".join(
        f"{k} {v['median']:.1f}s (max {v['max']:.1f}s, n={v['n']})"
        for k, v in s["time_to_flow_s"].items()
    )
    console.print(
        f"summary: {s['exact_rounds']}/{s['rounds']} rounds exact; {s['published']} published, "
        f"{s['lost']} lost, {s['doubled']} doubled, {s['dlq_missing']} hostile not "
        f"dead-lettered, {s['workers_died']} died on their own; {s['faults']} faults, "
        f"{s['never_flowed_again']} never followed by a result"
    )
    console.print(f"time to flow again (median): {ttf or '-'}")
    return 0 if s["exact_rounds"] == s["rounds"] == report["campaign"]["rounds"] else 1
