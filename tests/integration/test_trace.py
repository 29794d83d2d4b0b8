"""`ticketflow trace` on a ticket the session's worker processed: its audit records are
found on the one partition the producers' partitioner gives its id, and drawn."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from datetime import datetime, timedelta, timezone

import pytest

from streams.topics import Topics
from tests.integration.kafka_helpers import body, plain_producer, tickets
from ticketflow.trace import partition_of, read_audit, waterfall

pytestmark = pytest.mark.integration


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ticketflow.cli", *args],
        capture_output=True,
        text=True,
        env=os.environ.copy(),  # the session's topic prefix
        timeout=120,
    )


def wait_for_route(settings, ticket_id: str, timeout_s: float = 90):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        scan = read_audit(settings, ticket_id, idle_s=0.5)
        if any(r.step == "route" for r in scan.records):
            return scan
        time.sleep(0.5)
    raise AssertionError("the ticket's route step was never audited")


def test_trace_draws_a_processed_tickets_path_from_its_audit_partition(settings, worker, tmp_path):
    ticket = tickets(1, f"trace-{uuid.uuid4().hex[:6]}", seed=21)[0]
    tid = ticket["ticket_id"]
    p = plain_producer(settings.kafka_bootstrap)
    p.produce(Topics(settings.topic_prefix).tickets_in, key=tid, value=body(ticket))
    assert p.flush(10) == 0

    scan = wait_for_route(settings, tid)
    assert scan.partition == partition_of(tid.encode(), settings.partitions)
    steps = [r.step for r in sorted(scan.records, key=lambda r: r.at)]
    assert steps[0] == "validate" and steps[-1] == "route" and "infer" in steps
    assert len({r.trace_id for r in scan.records}) == 1
    assert all(r.ticket_id == tid for r in scan.records)

    png = tmp_path / "trace.png"
    out = cli("trace", tid, "--png", str(png))
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert scan.records[0].trace_id in out.stdout
    rows = [line.split()[0] for line in lines[3 : 3 + len(scan.records)]]
    assert rows == [b.label.split()[0] for b in waterfall(scan.records).bars]
    assert png.read_bytes()[:4] == b"\x89PNG"

    # from a time after the ticket: nothing to show, and the id is not echoed back
    later = (datetime.now(timezone.utc) + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%S")
    none = cli("trace", tid, "--since", later, "--no-png")
    assert none.returncode == 1 and tid not in none.stderr + none.stdout
    # from a time before it: the same records, read from the offset of that time
    earlier = (datetime.now(timezone.utc) - timedelta(minutes=10)).strftime("%Y-%m-%dT%H:%M:%S")
    since = cli("trace", tid, "--since", earlier, "--no-png")
    assert since.returncode == 0 and since.stdout.splitlines()[3:-1] == lines[3:-2]
