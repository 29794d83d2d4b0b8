"""Variant (e) of `ticketflow bench pipeline`: the six-step workflow written idiomatically in
quix-streams, the peer ticketflow is measured against.

    .venv-peer/bin/python -m benchmarks.peer --group G --state-dir D T0 T1 T2 T3 T4 T5 T6

One topic per step, as in ticketflow's default topology: T0 (tickets) -> validate -> T1 ->
clean -> T2 -> features -> T3 -> infer -> T4 -> rules -> T5 -> route -> T6 (results). Each
step is a stateful apply: the ticket's status goes into the step's changelog-backed store,
as ticketflow keeps per-ticket state in a changelog-backed table. The work per step is the
naive variant's (b): `parse_ticket`, `clean_text`, one Redis read of `user_ticket_stats`, one
gateway call, `apply_rules`, and a `TicketResult` out. Exactly-once is on.

It runs in a venv of its own (`make peer`): quixstreams 3.28.1 needs a confluent-kafka older
than the worker's. The step functions import neither quixstreams nor httpx, so the unit
tests import them from the project's venv.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from agents.steps.clean import clean_text
from agents.steps.rules import RuleInput, apply_rules
from agents.steps.validate import parse_ticket
from feature_jobs.store import ViewKeys, materialize
from schemas.features import FeatureView
from schemas.tickets import Context, FeatureValue, Prediction, TicketResult
from streams.redis_config import Target

STEPS = ("validate", "clean", "features", "infer", "rules", "route")
WORKFLOW, WORKFLOW_VERSION = "ticket_classify", 1
RULES = ["refund_check", "score_threshold"]
THRESHOLD = 0.5
MODEL, INFER_TIMEOUT_MS = "ticket_classifier", 300
FEATURE_VIEW = "user_ticket_stats"

Record = dict[str, Any]
Reader = Callable[[str | None], dict[str, dict[str, Any]]]
Predictor = Callable[[str, str], dict[str, Any]]


class GatewayDown(Exception):
    """No prediction from the gateway: the ticket is degraded, as in ticketflow."""


# ---- the steps: pure functions of the record (and the step's client) -------------------------


def validate(raw: bytes, max_bytes: int) -> Record:
    ticket = parse_ticket(raw, max_bytes)
    return {"ticket": ticket.model_dump(mode="json"), "started": time.time(), "path": []}


def clean(rec: Record) -> Record:
    rec["clean_text"] = clean_text(rec["ticket"]["text"])
    return rec


def features(rec: Record, read: Reader) -> Record:
    rec["features"] = read(rec["ticket"].get("user_id"))
    return rec


def infer(rec: Record, predict: Predictor) -> Record:
    # the ticket's own text when cleaning left none: the gateway refuses an empty one
    text = rec["clean_text"] or rec["ticket"]["text"]
    try:
        resp = predict(rec["ticket"]["ticket_id"], text)
    except GatewayDown as exc:
        rec["prediction"], rec["degraded_reason"] = None, f"inference: {exc}"
        return rec
    out = resp["outputs"][0]
    rec["prediction"] = Prediction(
        category=out["label"],
        confidence=out["confidence"],
        model_name=resp["model"],
        model_version=out.get("version") or resp["version"],
    ).model_dump(mode="json")
    return rec


def rules(rec: Record) -> Record:
    pred = rec.get("prediction")
    ctx = Context(
        prediction=Prediction.model_validate(pred) if pred else None,
        degraded=pred is None,
        degraded_reason=rec.get("degraded_reason"),
    )
    text = rec["clean_text"] or rec["ticket"]["text"]
    rec["rule"] = apply_rules(RULES, RuleInput(text, ctx, THRESHOLD)).model_dump(mode="json")
    return rec


def route(rec: Record) -> Record:
    return rec  # the route is the rules' decision; the result is written after the path


def result(rec: Record) -> Record:
    """The ticket's result, as ticketflow's router writes it (a `TicketResult`)."""
    pred, rule = rec.get("prediction") or {}, rec["rule"]
    return TicketResult(
        ticket_id=rec["ticket"]["ticket_id"],
        route=rule["route"],
        category=rule["category"],
        confidence=pred.get("confidence", 0.0),
        model_name=pred.get("model_name"),
        model_version=pred.get("model_version"),
        degraded=not pred,
        degraded_reason=rec.get("degraded_reason"),
        features=rec["features"],
        decision_path=rec["path"],
        latency_ms=max(0.0, (time.time() - rec["started"]) * 1000),
        completed_at=datetime.now(timezone.utc),
        workflow=WORKFLOW,
        workflow_version=WORKFLOW_VERSION,
    ).model_dump(mode="json")


def timed(step: str, fn: Callable[[Any], Record]) -> Callable[[Any, Any], Record]:
    """`fn` as a stateful apply: its decision-path entry, and the ticket's status in the
    step's store (quix keys the store by the message key, the ticket id)."""

    def apply(value: Any, state: Any) -> Record:
        started = time.perf_counter()
        rec = fn(value)
        ms = (time.perf_counter() - started) * 1000
        rec["path"].append({"step": step, "status": "ok", "attempt": 1, "latency_ms": ms})
        state.set("status", step)
        return rec

    return apply


# ---- the clients: synchronous, as quix's processing is ----------------------------------------


class FeatureReads:
    """The `features` step's read, synchronous: the view's built marker, its signature pointer
    and the entity's hash in one Redis round trip, behind the same 2 s cache, as
    `feature_jobs.reader.OnlineFeatureReader` (what the naive variant uses)."""

    def __init__(self, redis_url: Target, view: FeatureView, key_prefix: str, ttl_s: float = 2.0):
        import redis

        from streams.redis_config import sync_client

        self._redis = sync_client(redis_url, socket_timeout=1.0, socket_connect_timeout=0.5)
        self._errors = (redis.RedisError, OSError)
        self._view, self._keys, self._ttl_s = view, ViewKeys.of(view, key_prefix), ttl_s
        self._cache: dict[str, tuple[float, dict[str, dict[str, Any]]]] = {}

    def __call__(self, entity: str | None) -> dict[str, dict[str, Any]]:
        if entity is None:
            return self._fallback()
        now = time.monotonic()
        cached = self._cache.get(entity)
        if cached is not None and cached[0] > now:
            return cached[1]
        try:
            pipe = self._redis.pipeline(transaction=False)
            pipe.get(self._keys.built)
            pipe.get(self._keys.pointer)
            pipe.hgetall(self._keys.state(entity))
            built, _pointer, raw = pipe.execute()
        except self._errors:
            return self._fallback()
        if built is None or built.decode() != self._keys.signature:
            return self._fallback()  # not built: defaults, uncached, as the reader does
        values = materialize(self._view, raw or {}, int(time.time() * 1000))
        out = {n: FeatureValue(value=v).model_dump(mode="json") for n, v in values.items()}
        self._cache[entity] = (now + self._ttl_s, out)
        return out

    def _fallback(self) -> dict[str, dict[str, Any]]:
        return {
            f.name: FeatureValue(value=f.default, is_fallback=True).model_dump(mode="json")
            for f in self._view.features
        }


class GatewayCalls:
    """One synchronous predict call per ticket over a kept-alive connection, the request
    `inference_gateway.client.GatewayClient` sends (no version pinned: the routing decides)."""

    def __init__(self, base_url: str, grace_ms: int = 50) -> None:
        import httpx

        self._http = httpx.Client(
            base_url=base_url.rstrip("/"), timeout=(INFER_TIMEOUT_MS + grace_ms) / 1000
        )
        self._errors = (httpx.HTTPError,)

    def __call__(self, ticket_id: str, text: str) -> dict[str, Any]:
        body = {"inputs": [{"id": ticket_id, "text": text}], "timeout_ms": INFER_TIMEOUT_MS}
        try:
            resp = self._http.post(f"/v1/models/{MODEL}/predict", json=body)
        except self._errors as exc:
            raise GatewayDown(type(exc).__name__) from None
        if resp.status_code != 200:
            raise GatewayDown(f"HTTP {resp.status_code}")
        return resp.json()


# ---- the application ----------------------------------------------------------------------------


def _broker(settings: Any) -> Any:
    """quix's broker address: the bootstrap string, or its ConnectionConfig when secured."""
    if settings.kafka_security_protocol == "PLAINTEXT":
        return settings.kafka_bootstrap
    from quixstreams.kafka.configuration import ConnectionConfig

    from streams.kafka_config import confluent_config

    return ConnectionConfig.from_librdkafka_dict(dict(confluent_config(settings)))


def build_app(args: argparse.Namespace) -> Any:
    """The quix Application with one stateful StreamingDataFrame per step."""
    from quixstreams import Application

    from feature_jobs.views import VIEWS
    from streams.settings import get_settings

    settings = get_settings()
    app = Application(
        broker_address=_broker(settings),
        consumer_group=args.group,
        # fresh topics: the tickets published before this app joined are its to process
        auto_offset_reset="earliest",
        processing_guarantee="exactly-once",
        # the worker's commit cadence: under exactly-once a hop's output is visible to the
        # next hop only once committed, so quix's 5 s default would be 5 s a hop
        commit_interval=args.commit_interval or settings.commit_interval_s,
        state_dir=args.state_dir,
        loglevel="WARNING",
    )
    read = FeatureReads(settings.redis, VIEWS[FEATURE_VIEW], settings.features.key_prefix)
    predict = GatewayCalls(settings.gateway_url)
    work: dict[str, Callable[[Any], Record]] = {
        "validate": lambda raw: validate(raw, settings.max_record_bytes),
        "clean": clean,
        "features": lambda rec: features(rec, read),
        "infer": lambda rec: infer(rec, predict),
        "rules": rules,
        "route": route,
    }
    # one Topic per name: each is one step's sink and the next one's source
    topics = [
        app.topic(
            name,
            key_deserializer="bytes",
            value_deserializer="bytes" if i == 0 else "json",
            key_serializer="bytes",
            value_serializer="json",
        )
        for i, name in enumerate(args.topics)
    ]
    for i, step in enumerate(STEPS):
        sdf = app.dataframe(topics[i]).apply(timed(step, work[step]), stateful=True)
        if step == "route":
            sdf = sdf.apply(result)
        sdf.to_topic(topics[i + 1])
    return app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.peer")
    parser.add_argument("--group", required=True, help="the consumer group (and state scope)")
    parser.add_argument("--state-dir", required=True, help="where quix keeps its RocksDB stores")
    parser.add_argument(
        "--commit-interval", type=float, default=None, help="seconds (default: the worker's)"
    )
    parser.add_argument("topics", nargs=len(STEPS) + 1, help="tickets, five step topics, results")
    build_app(parser.parse_args(argv)).run()  # until SIGTERM


if __name__ == "__main__":
    main()
