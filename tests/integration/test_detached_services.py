"""The demo's detached services: started with a pid file and a log like the stack's parts,
left alone when already serving, listed by `detached_status`, stopped by `stop_detached`
(which `ticketflow stack down` calls). A feature job of its own (state folder, web port and
topic prefix of this test) stands in for all of them, so the shared services are untouched.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from devstack import app_processes, process
from streams.settings import Settings


@pytest.fixture
def own(
    live_stack: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Settings]:
    # the child reads the environment, as the demo's do
    env = {
        "TICKETFLOW_STATE_DIR": str(tmp_path / "state"),
        "TICKETFLOW_FEATURES_WEB_PORT": str(app_processes.free_port()),
        "TICKETFLOW_TOPIC_PREFIX": f"det{uuid.uuid4().hex[:8]}.",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    yield Settings()
    # Faust's data folder goes under the state dir, not into the working directory
    assert not list(Path.cwd().glob(f"{env['TICKETFLOW_TOPIC_PREFIX']}*-data"))
    assert list((tmp_path / "state" / "faust").glob(f"{env['TICKETFLOW_TOPIC_PREFIX']}*-data"))


def test_a_detached_service_outlives_its_start_and_stop_detached_ends_it(own: Settings) -> None:
    said = app_processes.start_detached(own, "features")
    pid_file = process.pid_path(own, "features")
    record = process.live_record(pid_file)
    assert record is not None and said == f"features: started, pid {record.pid}"
    assert process.log_path(own, "features").read_text().strip()
    try:
        # a second start finds it serving and starts nothing
        assert app_processes.start_detached(own, "features") == "features: already running"
        (status,) = [s for s in app_processes.detached_status(own) if s.name == "features"]
        assert status.healthy and status.ours and status.pid == record.pid
        assert status.ports == (own.features.web_port,)
    finally:
        stopped = app_processes.stop_detached(own)
    assert stopped == ["features"]
    assert not process.record_alive(record)
    assert not pid_file.exists()
    features = next(p for p in app_processes.APP_PARTS if p.name == "features")
    assert not features.ready(own)
    assert app_processes.stop_detached(own) == []
