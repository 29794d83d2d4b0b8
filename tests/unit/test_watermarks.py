"""streams.watermarks: a transient answer of the cluster is waited out; anything else is not."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from streams import watermarks as wm


class Broker:
    """Answers with each of `errors` in turn, then with the watermarks."""

    def __init__(self, *errors: int) -> None:
        self.errors = list(errors)
        self.asked = 0

    def get_watermark_offsets(
        self, tp: TopicPartition, timeout: float = 1.0, cached: bool = True
    ) -> tuple[int, int]:
        assert cached is False  # a cached answer may be the one from before the election
        self.asked += 1
        if self.errors:
            raise KafkaException(KafkaError(self.errors.pop(0)))
        return 3, 17


@pytest.fixture(autouse=True)
def no_pause(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wm, "PAUSE_S", 0.0)


TP = TopicPartition("t", 0)


@pytest.mark.parametrize(
    "code",
    [
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._TRANSPORT,
        KafkaError._TIMED_OUT,
    ],
)
def test_a_transient_answer_is_asked_again(code: int) -> None:
    broker = Broker(code, code)
    assert wm.watermarks(broker, TP) == (3, 17)
    assert broker.asked == 3


@pytest.mark.parametrize(
    "code",
    [KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.SASL_AUTHENTICATION_FAILED],
)
def test_any_other_error_is_raised_at_once(code: int) -> None:
    broker = Broker(code)
    with pytest.raises(KafkaException) as raised:
        wm.watermarks(broker, TP)
    assert raised.value.args[0].code() == code
    assert broker.asked == 1


def test_a_cluster_that_never_settles_is_raised_at_the_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = iter(float(t) for t in range(1000))
    monkeypatch.setattr(wm.time, "monotonic", lambda: next(clock))
    broker = Broker(*[KafkaError.NOT_LEADER_FOR_PARTITION] * 100)
    with pytest.raises(KafkaException):
        wm.watermarks(broker, TP, timeout_s=5.0)
    assert 1 < broker.asked < 10
