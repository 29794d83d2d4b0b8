"""The one place that reaches into faust-streaming's private internals.

Everything else in ticketflow uses Faust's public API. What is here was read from, and
tested against, exactly `FAUST_VERSION`; `check_version()` refuses to start on another one,
since a private attribute can change meaning in a patch release.

What we need from inside Faust, and why:
- `set_current_event`: a table write goes to the changelog partition of the *current*
  event; in a batch that is the last event taken, not the ticket's own.
- `install_commit`: Faust's offset commit is replaced by `CommitBarrier.commit`, so a
  committed input always has its results, outputs and state on the broker.
- `OffsetBook`: the consumer's acknowledged offsets, gaps and committed offsets, which
  the commit guard (`streams/gaps.py`) reads to decide what may be committed.
- `restore_seconds`: how long the last table restore took (Faust keeps no public figure).
- `PromptTableManager`: Faust's table manager sleeps a fixed second before it starts
  recovery, to let late tables register; ours are all registered before the app starts,
  so that second is only a second longer to come back after a crash.
- `shorten_fetch_wait`: Faust builds its aiokafka consumer with `fetch_max_wait_ms=1500`
  and no setting to change it. A fetch already waiting on the broker does not include
  partitions assigned or resumed after it was sent, so after every assignment, restore
  or seek the new partitions waited up to 1.5 s for their first records.
- `assignment`: the partitions the worker holds, asked of Faust's transport consumer,
  which sits outside Faust's agent and table API.
- `read_offsets`: the last offset Faust handed on per partition, for the consumer-lag
  gauge (agents/probes.py); Faust exposes no position of its own.
- `observe_fetches`: when the consumer thread got each batch of records from the broker,
  the one point of a hop that Faust exposes nowhere (docs/workflow.md, "Where a hop's
  time goes").
- `recovery_view`, `fetch_state`, `reread_changelogs`: how far a table restore got, and a
  way to restart its reading (`streams/recovery_watch.py`: Faust's recovery waits for
  ever when its changelog records stop arriving).
- `deliver_inline`: Faust's fetch loop hands each record to the streams through
  `wait_first(callback, suspend_flow.wait())`, four tasks and an `asyncio.wait` per record
  (about a tenth of a worker's CPU); the callback almost never has to wait, so it is run in
  place first and put into a task only when it does (docs/perf-profile.md).
- `QuietMonitor`: Faust's `Monitor` sensor keeps per-event statistics that nothing here
  reads (the worker's metrics are Prometheus'); it keeps everything else.
"""

from __future__ import annotations

import inspect
import time
import weakref
from collections.abc import Awaitable, Callable, Generator, Mapping
from dataclasses import dataclass
from importlib.metadata import version
from typing import Any

import faust
from aiokafka import TopicPartition as KafkaTP
from faust.sensors import Monitor
from faust.streams import _current_event
from faust.tables import TableManager
from mode.services import WaitResults

FAUST_VERSION = "0.15.3"
# the aiokafka whose consumer attribute `shorten_fetch_wait` sets
AIOKAFKA_VERSIONS = ("0.12.", "0.13.", "0.14.")


def _internals(obj: object) -> Any:
    """`obj` as the untyped thing it is here: Faust's and aiokafka's private attributes, which
    their type information does not describe and which only this module reads."""
    return obj


class UnsupportedFaust(RuntimeError):
    """The installed faust-streaming is not the one this adapter was tested on."""


def check_version(installed: str | None = None) -> None:
    found = installed or version("faust-streaming")
    if found != FAUST_VERSION:
        raise UnsupportedFaust(
            f"faust-streaming {found} is installed; ticketflow's adapter "
            f"(streams/faust_adapter.py) is tested on {FAUST_VERSION} only"
        )


class PromptTableManager(TableManager):
    """Faust's table manager without the fixed one-second sleep before recovery
    (pass as the app's `TableManager` setting; every table is added before start)."""

    async def on_start(self) -> None:
        if not self.should_stop:
            await self._update_channels()
            await self.recovery.start()


def shorten_fetch_wait(app: faust.App, wait_ms: int) -> None:
    """Make the worker consumer's broker-side fetch wait `wait_ms` instead of Faust's
    hard-coded 1500 ms (call before the app starts)."""
    found = version("aiokafka")
    if not found.startswith(AIOKAFKA_VERSIONS):
        raise UnsupportedFaust(f"aiokafka {found}: shorten_fetch_wait is tested on 0.12-0.14")
    thread = _internals(app.consumer)._thread
    create = thread._create_worker_consumer

    def _create_worker_consumer(transport: Any) -> Any:
        consumer = create(transport)
        consumer._fetch_max_wait_ms = wait_ms  # read when the consumer starts its fetcher
        return consumer

    thread._create_worker_consumer = _create_worker_consumer


class QuietMonitor(Monitor):
    """Faust's Monitor without its per-record and per-event bookkeeping (pass as the app's
    `Monitor` setting); commits, rebalances and assignments are still kept."""

    def on_message_in(self, tp: Any, offset: int, message: Any) -> None:
        return None

    def on_stream_event_in(self, tp: Any, offset: int, stream: Any, event: Any) -> None:
        return None

    def on_stream_event_out(
        self, tp: Any, offset: int, stream: Any, event: Any, state: Any = None
    ) -> None:
        return None

    def on_message_out(self, tp: Any, offset: int, message: Any) -> None:
        return None

    def on_table_get(self, table: Any, key: Any) -> None:
        return None

    def on_table_set(self, table: Any, key: Any, value: Any) -> None:
        return None


class _Resumed:
    """The rest of a coroutine that was stepped once by hand and yielded `yielded`, as an
    awaitable: what `yield from` would do after its first step."""

    def __init__(self, coro: Any, yielded: Any) -> None:
        self._coro, self._yielded = coro, yielded

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, yielded = self._coro, self._yielded
        while True:
            try:
                sent = yield yielded
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:
                try:
                    yielded = coro.throw(exc)
                except StopIteration as stop:
                    return stop.value
            else:
                try:
                    yielded = coro.send(sent)
                except StopIteration as stop:
                    return stop.value


def deliver_inline(app: faust.App) -> None:
    """Make the fetch loop's per-record `wait_first(callback(message), suspend_flow.wait())`
    run the callback in place: when it finishes without waiting (the queue has room, flow
    is on) no task is made; when it waits, the rest of it runs under Faust's own
    `wait_first`, as before. With flow suspended Faust's path is taken unchanged."""
    consumer = _internals(app.consumer)
    original = consumer.wait_first
    suspend = consumer.suspend_flow  # an asyncio.Event in this Faust
    flow_wait = type(suspend).wait.__code__

    async def wait_first(*coros: Any, timeout: Any = None) -> WaitResults:
        if (
            timeout is not None
            or len(coros) != 2
            or not inspect.iscoroutine(coros[0])
            or getattr(coros[1], "cr_code", None) is not flow_wait
            or suspend.is_set()
        ):
            return await original(*coros, timeout=timeout)
        callback, flow = coros
        try:
            yielded = callback.send(None)
        except StopIteration as stop:
            flow.close()
            if consumer._stopped.is_set() or consumer._crashed.is_set():
                return WaitResults([], [], True)
            return WaitResults([callback], [stop.value], False)
        except BaseException:
            flow.close()
            raise
        return await original(_Resumed(callback, yielded), flow)

    consumer.wait_first = wait_first


def set_current_event(event: faust.EventT) -> None:
    _current_event.set(weakref.ref(event))


def add_table(app: faust.App, table_class: type[faust.Table], **kwargs: Any) -> Any:
    """A table of our own class, registered as `app.Table(...)` registers Faust's: with the
    table manager's beacon, so its changelog recovery is part of the app's."""
    return app.tables.add(table_class(app, beacon=app.tables.beacon, **kwargs))


def tables_recovered(app: faust.App) -> bool:
    """Whether every table is restored from its changelog (the latest rebalance's)."""
    return bool(_internals(app.tables).recovery.completed.is_set())


def restore_seconds(app: faust.App) -> float | None:
    recovery = _internals(app.tables).recovery
    started, ended = recovery._recovery_started_at, recovery._recovery_ended_at
    if started is None or ended is None or ended < started:
        return None
    return ended - started


def observe_fetches(app: faust.App, seen: Callable[[Any, float], None]) -> None:
    """Call `seen(records_by_partition, fetched_at)` on the consumer thread for every batch
    the aiokafka fetcher hands to Faust; `fetched_at` is `time.time()`, the clock of the
    records' CreateTime stamps. `seen` must be cheap and must not raise."""
    thread = _internals(app.consumer)._thread
    fetch = thread._fetch_records

    async def _fetch_records(*args: Any, **kwargs: Any) -> Any:
        records = await fetch(*args, **kwargs)
        if records:
            seen(records, time.time())
        return records

    thread._fetch_records = _fetch_records


def topic_partitions(app: faust.App, topic: str) -> int | None:
    """The partition count of `topic` from the consumer's cluster metadata, None where
    unknown. Faust's own `topic_partitions` reads the group coordinator's snapshot, which
    aiokafka keeps on the group's leader only: every other member would see None."""
    kafka = _internals(app.consumer)._thread._consumer
    partitions = kafka._client.cluster.partitions_for_topic(topic) if kafka else None
    return len(partitions) if partitions else app.consumer.topic_partitions(topic)


def assignment(app: faust.App) -> set[Any]:
    """The partitions this worker's consumer holds now (its transport's own view)."""
    return set(app.consumer.assignment())


def read_offsets(consumer: Any) -> Mapping[Any, int | None]:
    """The last offset the consumer handed on, per partition (Faust's own bookkeeping)."""
    return consumer._read_offset


class OffsetBook:
    """The consumer's offset bookkeeping, and the two hooks the commit guard replaces."""

    def __init__(self, app: faust.App) -> None:
        self._app = app

    @property
    def _consumer(self) -> Any:
        return self._app.consumer

    def assignment(self) -> set[Any]:
        return assignment(self._app)

    def acked(self, tp: Any) -> list[int]:
        """The acknowledged offsets not yet committed (Faust's own list: edit in place)."""
        return self._consumer._acked[tp]

    def forget_acked(self, tp: Any, offsets: list[int]) -> None:
        """Drop `offsets` from the acknowledged list and its index."""
        gone = set(offsets)
        acked = self._consumer._acked[tp]
        acked[:] = [o for o in acked if o not in gone]
        self._consumer._acked_index[tp].difference_update(gone)

    def committed(self, tp: Any) -> int | None:
        return self._consumer._committed_offset.get(tp)

    def highwater(self, tp: Any) -> int:
        """The partition's end as of the last fetch (0 before any fetch)."""
        try:
            return self._consumer.highwater(tp) or 0
        except Exception:  # no fetch yet for a just-assigned partition
            return 0

    async def seek(self, positions: dict[Any, int]) -> None:
        """Read each partition again from its offset (Faust's `perform_seek` skips a
        partition that has no committed offset, so it cannot reread one never committed).

        On the consumer's own thread: Faust's `Consumer.seek` calls aiokafka's `seek` from
        the caller's thread, which drops the partition's fetched records while the consumer
        thread may be draining them (a KeyError in `Fetcher.fetched_records` that crashes
        Faust's fetcher for good: the worker stays in its group and reads nothing more)."""
        if positions:
            await self._consumer._thread.seek_wait(dict(positions))

    def is_changelog(self, tp: Any) -> bool:
        return tp.topic in self._app.tables.changelog_topics

    def gaps(self, tp: Any) -> Any:
        """Faust's interval tree of skipped offsets counted as acknowledged."""
        return self._consumer._gap[tp]

    def add_empty_span(self, tp: Any, begin: int, end: int) -> None:
        """Count [begin, end) as acknowledged: it holds no record (markers, retention)."""
        self._consumer._gap[tp].addi(begin, end)

    def replace_hooks(
        self,
        add_gap: Callable[[Any, int, int, Callable[..., Awaitable[None]]], Awaitable[None]],
        new_offset: Callable[[Any], int | None],
    ) -> None:
        """Route Faust's gap recording and its choice of offset to commit through ours.

        `add_gap(tp, from, to, faust_add_gap)` gets Faust's own function to delegate to.
        """
        consumer = self._consumer
        faust_add_gap = consumer._add_gap

        async def _add_gap(tp: Any, offset_from: int, offset_to: int) -> None:
            await add_gap(tp, offset_from, offset_to, faust_add_gap)

        consumer._add_gap = _add_gap
        consumer._new_offset = new_offset


class FaustOffsets:
    """What `CommitBarrier` needs of the consumer to commit offsets, as Faust would."""

    def __init__(self, app: faust.App) -> None:
        self._app = app

    def generation(self) -> int:
        return self._app.consumer_generation_id

    def assignment(self) -> set[Any]:
        return assignment(self._app)

    async def commit(self, offsets: Any) -> bool:
        consumer = _internals(self._app.consumer)
        did_commit = await consumer._commit(offsets)
        if did_commit:
            self._app.tables.on_commit(offsets)
            consumer._committed_offset.update(offsets)
            self._app.monitor.on_tp_commit(offsets)
        return did_commit


def install_commit(app: faust.App, commit: Callable[[Any, FaustOffsets], Awaitable[bool]]) -> None:
    """Make `commit(offsets, FaustOffsets)` the whole of Faust's offset commit.

    Faust's own version flushes its producer, commits, and then records the offsets as
    committed even when the commit failed; ours records only what the broker took.
    Faust's transactional mode is not supported (we run at_least_once).
    """
    consumer = _internals(app.consumer)
    offsets = FaustOffsets(app)

    async def _commit_offsets(committable: Any, start_new_transaction: bool = True) -> bool:
        await app.producer.flush()  # Faust's own sends (table changelogs we do not use)
        return await commit(committable, offsets)

    consumer._commit_offsets = _commit_offsets


@dataclass(frozen=True)
class RecoveryView:
    """Where the table restore of the current rebalance stands (monotonic clock)."""

    in_recovery: bool
    started_at: float | None
    remaining: Mapping[Any, int]  # active changelog partition -> records still to read
    read_to: Mapping[Any, int]  # active changelog partition -> last offset read (-1: none)
    last_event_at: Mapping[Any, float]  # active changelog partition -> last record read


def recovery_view(app: faust.App) -> RecoveryView:
    recovery = _internals(app.tables).recovery
    return RecoveryView(
        in_recovery=bool(recovery.in_recovery),
        started_at=recovery._recovery_started_at,
        remaining=dict(recovery.active_remaining()),
        read_to={tp: -1 if o is None else o for tp, o in recovery.active_offsets.items()},
        last_event_at=dict(recovery._active_events_received_at),
    )


def fetch_state(app: faust.App, tps: Any) -> dict[Any, dict[str, Any]]:
    """What Faust and aiokafka each believe about fetching `tps`, for the log."""
    consumer = _internals(app.consumer)
    paused, active = consumer._paused_partitions, consumer._active_partitions or set()
    kafka = consumer._thread._consumer
    subscribed = kafka._fetcher._subscriptions.subscription.assignment if kafka else None
    state: dict[Any, dict[str, Any]] = {}
    for tp in tps:
        row: dict[str, Any] = {
            "faust_read_offset": consumer._read_offset.get(tp),
            "faust_paused": tp in paused,
            "faust_active": tp in active,
            "flow_active": consumer.flow_active,
        }
        if subscribed is not None and kafka is not None:
            part = KafkaTP(tp.topic, tp.partition)
            if part in subscribed.tps:
                tp_state = subscribed.state_value(part)
                row["position"] = tp_state.position if tp_state.has_valid_position else None
                row["kafka_paused"] = tp_state.paused
                row["buffered"] = part in kafka._fetcher._records
        state[tp] = row
    return state


async def reread_changelogs(app: faust.App, positions: Mapping[Any, int]) -> None:
    """Read the changelog partitions again from `positions`, as recovery's own seek does.

    Faust's `seek_wait` moves aiokafka's position, drops its buffered records and resets
    Faust's read offset (below which its fetch loop drops records); then the partitions,
    the flow and the fetcher are resumed as recovery resumes them."""
    consumer = app.consumer
    await consumer.seek_wait(dict(positions))
    consumer.resume_partitions(set(positions))
    app.flow_control.resume()
    consumer.resume_flow()
    await app._fetcher.maybe_start()
