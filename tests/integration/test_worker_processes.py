"""Issue 23: `ticketflow worker --processes 2`, two members of one consumer group under a
supervisor. A SIGKILL of one child mid-stream loses no ticket and doubles none, as a
read_committed consumer sees the results; the supervisor starts the child again."""

from __future__ import annotations

import os
import signal
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from devstack import app_processes
from tests.integration.kafka_helpers import tickets
from tests.integration.test_faults import PrivatePipeline, assert_exactly_once

pytestmark = pytest.mark.integration


def children_of(pid: int) -> list[int]:
    """The live processes whose parent is `pid` (from /proc)."""
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2 :].split()
        if int(fields[1]) == pid and fields[0] != "Z":
            kids.append(int(stat.parent.name))
    return sorted(kids)


class TwoProcessPipeline(PrivatePipeline):
    def start_worker(self) -> None:
        self._starts += 1
        name = f"worker-{self.settings.topic_prefix}{self._starts}"
        self.worker = app_processes.start_worker(
            self.settings, self.env, name, loglevel="info", processes=2
        )


@pytest.fixture
def two(live_stack, gateway):
    p = TwoProcessPipeline()
    p.start_worker()
    yield p
    p.close()


def test_a_child_killed_mid_stream_is_restarted_and_nothing_is_lost_or_doubled(two):
    p = two
    kids = children_of(p.worker.process.pid)
    assert len(kids) == 2, kids
    batch = tickets(2000, "procs", seed=23)
    feeder = threading.Thread(target=p.publish, args=(batch, 200), daemon=True)
    feeder.start()
    p.watch.until(lambda rs: len(rs) >= 400, 120, settle_s=0)
    os.kill(kids[1], signal.SIGKILL)  # SIGKILL one child, not the supervisor
    assert len(p.watch.records) < len(batch), "the kill came after the last result"
    deadline = time.monotonic() + 30
    # the killed child is reaped by the supervisor, which starts another in its place
    while time.monotonic() < deadline:
        now = children_of(p.worker.process.pid)
        if len(now) == 2 and kids[1] not in now:
            break
        time.sleep(0.2)
    after = children_of(p.worker.process.pid)
    assert len(after) == 2 and kids[1] not in after and kids[0] in after
    feeder.join(120)
    assert_exactly_once(batch, p.results_for(batch, 240), p)
    assert p.worker.process.poll() is None  # the supervisor lives on


def _counter(port: int, name: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name))


def test_every_child_bundles_and_hands_over_not_only_the_groups_leader(two):
    """Each child knows every step topic's partition count (aiokafka keeps the group
    coordinator's metadata snapshot on the leader only), so each bundles a batch and takes
    its own envelopes in memory (agents/handoff.py)."""
    p = two
    batch = tickets(800, "procs-bundles", seed=24)
    p.publish(batch)  # a burst: every step's batches hold many envelopes a partition
    assert_exactly_once(batch, p.results_for(batch, 240), p)
    base = p.settings.worker_web_port
    for child in range(2):
        port = base + 10 * child
        assert _counter(port, "workflow_bundled_envelopes_total") > 0, f"child {child}"
        assert _counter(port, "workflow_handed_envelopes_total") > 0, f"child {child}"
