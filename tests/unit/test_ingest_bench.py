"""`ticketflow bench ingest`'s pieces that need no stack: its HTTP client, ratios, report."""

from __future__ import annotations

import json
from pathlib import Path

import orjson
from aiohttp import web
from aiohttp.test_utils import TestServer

from benchmarks.ingest import (
    BATCH,
    Connection,
    Figure,
    batches_of,
    closed_loop,
    percentiles,
    post,
    report,
    tickets,
)


def test_tickets_and_batches() -> None:
    records = tickets(250, "t")
    assert len({k for k, _ in records}) == 250
    assert all(orjson.loads(v)["ticket_id"] == k for k, v in records)
    bodies = batches_of(records)
    assert [n for n, _ in bodies] == [BATCH, BATCH, 50]
    assert len(orjson.loads(bodies[0][1])["tickets"]) == BATCH


def test_percentiles() -> None:
    assert percentiles([float(i) for i in range(1, 101)]) == {"p50": 50.5, "p99": 99.01}


async def test_the_client_posts_and_reads_answers_on_one_connection() -> None:
    seen: list[int] = []

    async def handler(request: web.Request) -> web.Response:
        seen.append(len(await request.read()))
        assert request.headers["Authorization"] == "Bearer tok"
        return web.json_response({"ok": True}, status=202)

    app = web.Application()
    app.router.add_post("/v1/tickets", handler)
    async with TestServer(app) as server:
        port = server.port
        assert port is not None
        conn = await Connection.open(port)
        for body in (b"{}", b'{"a": 1}'):
            status, answer = await conn.send(post(port, "tok", body))
            assert (status, orjson.loads(answer)) == (202, {"ok": True})
        conn.close()
        figure = await closed_loop(port, "tok", [(1, b"{}")] * 20, 4, "x", lambda: 0.0)
    assert seen[:2] == [2, 8]
    assert figure.requests == 20 and figure.refused == 0 and figure.tickets_per_s > 0


def test_report_ratios_targets_json_and_png(tmp_path: Path) -> None:
    bare = [
        Figure("bare producer, async", 100_000.0, 1000),
        Figure("bare producer, each record acked", 10_000.0, 1000, {"p50": 2.0, "p99": 5.0}),
        Figure("bare producer, 100 acked", 60_000.0, 10, {"p50": 3.0, "p99": 6.0}),
    ]
    ingest = [
        Figure("ingest, single posts", 4_000.0, 1000, {"p50": 5.0, "p99": 9.0}, 0.2),
        Figure("ingest, batches of 100", 30_000.0, 10, {"p50": 8.0, "p99": 12.0}, 0.01),
        Figure(
            "ingest, single posts at 50%",
            2_000.0,
            500,
            {"p50": 3.0, "p99": 30.0, "offered_per_s": 2000.0},
        ),
    ]
    data = report(bare, ingest, 32, tmp_path)
    assert data["ratios"]["single_over_bare_acked"] == 0.4
    assert data["ratios"]["batch_over_bare_acked"] == 0.5
    assert data["ratios"]["single_over_bare_async"] == 0.04
    assert data["met"] == {
        "single_ratio": True,
        "batch_ratio": False,
        "single_p99_ms_at_half": False,
    }
    assert json.loads((tmp_path / "ingest.json").read_text())["ratios"] == data["ratios"]
    assert (tmp_path / "ingest.png").stat().st_size > 10_000
