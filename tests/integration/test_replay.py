"""DLQ replay on the real Kafka: hand-made dead letters of every kind go back where the
workers would read them (no worker runs here), once; the rest is refused or parked."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import datetime, timezone

import pytest
from confluent_kafka import Producer

from streams.admin import delete_prefixed, ensure_topics, pipeline_topics
from streams.headers import REPLAY_COUNT, DeadLetterContext, Headers
from streams.settings import Settings
from streams.topics import Topics
from ticketflow.kafka_io import Record, read_topic
from ticketflow.replay import Filters, replay

pytestmark = pytest.mark.integration

STEPS = ["clean", "features", "infer", "rules", "route"]


@pytest.fixture
def own(live_stack: Settings) -> Iterator[Settings]:
    """Settings on a topic prefix (and so a replay group) of this test's own."""
    prefix = f"rp{uuid.uuid4().hex[:8]}."
    settings = live_stack.model_copy(update={"topic_prefix": prefix})
    ensure_topics(settings, pipeline_topics(Topics(prefix), STEPS, ["auto_classify"]))
    yield settings
    delete_prefixed(settings, prefix, prefix)


def dead_letter(step: str, origin: str, count: int | bytes | None = None) -> Headers:
    ctx = DeadLetterContext(
        error_class="INTERNAL",
        reason="simulated",
        step=step,
        attempts=1,
        origin_topic=origin,
        origin_partition=0,
        origin_offset=7,
        first_failed_at=datetime.now(timezone.utc),
        exception="simulated",
        traceparent=f"00-{'a' * 32}-{'b' * 16}-01",
    )
    headers = ctx.headers(count if isinstance(count, int) else 0)
    return [*headers, (REPLAY_COUNT, count)] if isinstance(count, bytes) else headers


def publish(settings: Settings, letters: dict[str, Headers]) -> None:
    p = Producer({"bootstrap.servers": settings.kafka_bootstrap})
    for key, headers in letters.items():
        p.produce(Topics(settings.topic_prefix).dlq, key=key, value=f"v-{key}", headers=headers)
    assert p.flush(15) == 0


def records(settings: Settings, topic: str) -> dict[str, Record]:
    return {
        (r.key or b"").decode(): r for r in read_topic(settings.kafka_bootstrap, topic, idle_s=2)
    }


def test_each_dead_letter_goes_back_once_to_a_consumed_topic(own: Settings) -> None:
    t = Topics(own.topic_prefix)
    publish(
        own,
        {
            "validate": dead_letter("validate", t.tickets_in),
            "infer": dead_letter("infer", t.step("infer"), count=1),
            "retry": dead_letter("retry", t.retry(800)),
            "review": dead_letter("review", t.review_decisions),
            "unknown": dead_letter("translate", t.step("translate")),
            "stray-retry": dead_letter("retry", t.step("infer")),
            "forged": dead_letter("rules", t.step("rules"), count=b"-1"),
            "spent": dead_letter("rules", t.step("rules"), count=own.max_replays),
        },
    )
    report = replay(own, Filters(), rate=0)
    outcomes = {i.key.decode(): i.outcome for i in report.items}
    assert outcomes == {
        "validate": "replayed",
        "infer": "replayed",
        "retry": "replayed",
        "review": "replayed",
        "unknown": "refused",
        "stray-retry": "refused",
        "forged": "parked",
        "spent": "parked",
    }
    back = {
        "validate": t.tickets_in,
        "infer": t.step("infer"),
        "retry": t.retry(800),
        "review": t.review_decisions,
    }
    for key, topic in back.items():
        [record] = [r for k, r in records(own, topic).items() if k == key]
        assert record.value == f"v-{key}".encode()
        assert record.headers["x-dlq-step"] in {key, "validate"}
        assert record.headers[REPLAY_COUNT] == ("2" if key == "infer" else "1")
    parked = records(own, t.dlq_parked)
    assert sorted(parked) == ["forged", "spent"]
    assert parked["forged"].headers[REPLAY_COUNT] == "-1"
    assert "forged" in parked["forged"].headers["x-replay-parked-reason"]
    reasons = report.reasons("refused")
    assert any("'translate' is in no workflow definition" in r for r in reasons)

    again = replay(own, Filters(), rate=0)
    assert again.items == [] and not again.unread
    assert len(records(own, t.tickets_in)) == 1 and len(records(own, t.dlq_parked)) == 2


def test_a_filtered_run_leaves_the_rest_and_the_next_replays_only_that(own: Settings) -> None:
    t = Topics(own.topic_prefix)
    # one partition's worth of keys would do; several keys spread them over the partitions
    letters = {f"c{i}": dead_letter("clean", t.step("clean")) for i in range(6)}
    letters.update({f"i{i}": dead_letter("infer", t.step("infer")) for i in range(6)})
    publish(own, letters)

    first = replay(own, Filters(step="infer"), rate=0)
    assert sorted(i.key.decode() for i in first.items) == [f"i{i}" for i in range(6)]
    assert first.skipped == 6

    second = replay(own, Filters(), rate=0)
    assert sorted(i.key.decode() for i in second.items) == [f"c{i}" for i in range(6)]
    assert replay(own, Filters(), rate=0).items == []
    assert sorted(records(own, t.step("infer"))) == [f"i{i}" for i in range(6)]
    assert sorted(records(own, t.step("clean"))) == [f"c{i}" for i in range(6)]


def test_what_lands_on_the_dlq_after_a_run_is_read_by_the_next(own: Settings) -> None:
    t = Topics(own.topic_prefix)
    publish(own, {"early": dead_letter("infer", t.step("infer"))})
    assert [i.key for i in replay(own, Filters(), rate=0).items] == [b"early"]
    publish(own, {"late": dead_letter("infer", t.step("infer"), count=1)})
    assert [i.key for i in replay(own, Filters(), rate=0).items] == [b"late"]
    assert records(own, t.step("infer"))["late"].headers[REPLAY_COUNT] == "2"
