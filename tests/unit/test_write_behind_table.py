import faust
import orjson
import pytest

from streams.tables import WriteBehindTable


class Sink:
    def __init__(self) -> None:
        self.records: list[tuple] = []

    def produce(self, topic, key, value, headers=None, partition=None) -> None:
        # keys as Faust's own table writes them (JSON), decoded for the assertions
        self.records.append((topic, orjson.loads(key), value, partition))


@pytest.fixture
def table(monkeypatch):
    app = faust.App("wbt-test", broker="kafka://127.0.0.1:1", store="memory://")
    t = app.tables.add(
        WriteBehindTable(app, name="state", default=None, beacon=app.tables.beacon, partitions=4)
    )
    # the partition is the current event's; here the key's first character picks it
    monkeypatch.setattr(t, "partition_for_key", lambda key: int(key[0]))
    return t


def test_writes_are_read_at_once_and_reach_the_changelog_only_when_flushed(table):
    sink = Sink()
    table.write_through(sink)
    table["1-a"] = {"status": "received"}
    assert table["1-a"] == {"status": "received"}
    assert sink.records == []
    assert table.flush_changelog() == 1
    (topic, key, value, partition), *rest = sink.records
    assert rest == []
    assert topic == "wbt-test-state-changelog"
    assert (key, orjson.loads(value), partition) == ("1-a", {"status": "received"}, 1)
    assert table.flush_changelog() == 0  # nothing new


def test_several_writes_of_a_key_between_flushes_become_its_newest_value(table):
    sink = Sink()
    table.write_through(sink)
    for status in ("received", "running", "completed"):
        table["2-b"] = {"status": status}
    table["3-c"] = {"status": "running"}
    assert table.dirty == 2
    table.flush_changelog()
    got = {(k, p): orjson.loads(v) for _, k, v, p in sink.records}
    assert got == {("2-b", 2): {"status": "completed"}, ("3-c", 3): {"status": "running"}}


def test_a_deleted_key_is_flushed_as_a_tombstone(table):
    sink = Sink()
    table.write_through(sink)
    table["0-x"] = {"status": "received"}
    del table["0-x"]
    table.flush_changelog()
    assert sink.records == [("wbt-test-state-changelog", "0-x", None, 0)]


def test_flushing_without_a_sink_is_a_clear_error(table):
    table["1-a"] = {"n": 1}
    with pytest.raises(RuntimeError, match="write_through"):
        table.flush_changelog()


def test_changelog_records_are_byte_for_byte_what_faust_writes(table):
    # compaction keeps one record per key only if every writer encodes the key alike
    class Raw:
        def __init__(self) -> None:
            self.records: list[tuple] = []

        def produce(self, topic, key, value, headers=None, partition=None) -> None:
            self.records.append((key, value))

    sink = Raw()
    table.write_through(sink)
    state = {"ticket_id": "1-é", "history": [["infer", "running", 1]], "n": {1: 2.5}}
    table["1-é"] = state
    table.flush_changelog()
    topic = table.changelog_topic
    [(key, value)] = sink.records
    assert key == topic.prepare_key("1-é", table.key_serializer)[0]
    assert value == topic.prepare_value(state, table.value_serializer)[0]
