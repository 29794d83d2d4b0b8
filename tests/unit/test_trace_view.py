"""`ticketflow trace`'s waterfall from audit records: the bars, the 80-column text, the PNG,
and the partition a ticket's audit records are on."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from schemas.tickets import AuditRecord, Category, StepStatus, TicketResult
from ticketflow.trace import (
    default_png,
    partition_of,
    render_png,
    render_text,
    result_line,
    waterfall,
)

T0 = datetime(2026, 12, 4, 10, 0, tzinfo=timezone.utc)
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


def audit(step: str, end_ms: float, latency_ms: float, **kw) -> AuditRecord:
    fields = {
        "ticket_id": "t-1",
        "trace_id": TRACE,
        "workflow": "ticket_classify",
        "workflow_version": 1,
        "step": step,
        "outcome": StepStatus.ok,
        "latency_ms": latency_ms,
        "input_sha256": "0" * 64,
        "at": T0 + timedelta(milliseconds=end_ms),
    }
    return AuditRecord(**{**fields, **kw})


# a ticket's path, out of order as a scan may meet them: infer retried once
PATH = [
    audit("rules", 190, 2),
    audit("validate", 1, 1),
    audit("infer", 120, 20, outcome=StepStatus.retrying),
    audit("infer", 180, 40, attempt=2, model_version="v2"),
    audit("clean", 30, 5),
    audit("route", 200, 1),
]


def test_bars_are_in_time_order_from_the_first_steps_start():
    w = waterfall(PATH)
    assert [b.label for b in w.bars] == ["validate", "clean", "infer", "infer #2", "rules", "route"]
    assert w.bars[0].start_ms == 0 and w.total_ms == pytest.approx(200)
    assert w.bars[3].start_ms == pytest.approx(140) and w.bars[3].latency_ms == 40
    assert w.bars[2].outcome == "retrying"
    assert w.model_version == "v2" and w.trace_id == TRACE


def test_the_text_view_fits_80_columns_and_scales_bars_to_the_total():
    text = render_text(waterfall(PATH))
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert TRACE in text and "ticket_classify v1" in text
    rows = {line.split()[0] + line.split()[1]: line for line in lines[3:]}
    infer2 = rows["infer#2"]
    track = infer2[infer2.index("|") + 1 : infer2.rindex("|")]
    # 40 of 200 ms: a fifth of the track, starting 70 % of the way in
    assert track.count("█") == round(len(track) * 40 / 200)
    assert track.index("█") == int(len(track) * 140 / 200)
    # the hop since the first infer ended (120 ms) is dotted
    assert track[int(len(track) * 125 / 200)] == "·"
    route = rows["routeok"]
    assert route.rstrip().endswith("█|")


def test_long_names_and_a_zero_length_path_still_fit():
    one = [audit("a_very_long_step_name_indeed", 0, 0)]
    lines = render_text(waterfall(one)).splitlines()
    assert max(len(line) for line in lines) <= 80
    assert lines[-1].count("█") == 1


def test_no_records_is_an_error():
    with pytest.raises(ValueError):
        waterfall([])


def test_the_png_is_written(tmp_path):
    path = render_png(waterfall(PATH), tmp_path / "sub" / "t.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_default_png_name_is_safe_for_any_ticket_id(tmp_path):
    class S:
        state_dir = str(tmp_path)

    path = default_png(S(), "../../etc/x:y")  # type: ignore[arg-type]
    assert path.parent == tmp_path / "traces" and "/" not in path.name[6:]


@pytest.mark.parametrize(
    ("key", "murmur2"),
    # Kafka's own test vectors of its Java murmur2 (UtilsTest.testMurmur2)
    [
        (b"21", -973932308),
        (b"foobar", -790332482),
        (b"a-little-bit-long-string", -985981536),
        (b"a-little-bit-longer-string", -1486304829),
        (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
        (b"abc", 479470107),
    ],
)
@pytest.mark.parametrize("partitions", [1, 4, 12])
def test_partition_of_is_the_java_clients_partitioner(key, murmur2, partitions):
    assert partition_of(key, partitions) == (murmur2 & 0x7FFFFFFF) % partitions


def test_the_result_line_says_route_category_confidence_and_time_in_80_columns():
    result = TicketResult(
        ticket_id="t-1",
        route="manual_review_for_a_route_with_a_long_name_" * 2,
        category=Category.billing,
        confidence=0.4321,
        model_name="ticket_classifier",
        model_version="v2",
        decision_path=[],
        latency_ms=412.26,
        completed_at=T0,
    )
    line = result_line(result)
    assert len(line) <= 80 and line.startswith("result: manual_review")
    short = result.model_copy(update={"route": "after_sales"})
    assert result_line(short) == "result: after_sales, billing 0.43, model v2, 412.3 ms end to end"
    degraded = short.model_copy(update={"degraded": True})
    assert "billing degraded" in result_line(degraded)


def test_control_characters_and_math_mode_from_the_topic_are_neutralised(tmp_path):
    forged = [audit("\x1b]0;pwned\x07step", 5, 5, model_version="$\\frac{1}{0}$")]
    w = waterfall(forged)
    text = render_text(w)
    assert "\x1b" not in text and "\x07" not in text and "$" not in text
    render_png(w, tmp_path / "forged.png")  # no mathtext error
