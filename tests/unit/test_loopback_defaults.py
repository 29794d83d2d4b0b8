"""Every web server of ours listens on loopback unless told otherwise (docs/architecture.md,
"Security"): the workers' web views (table views, /ticket/<id>, /metrics), the feature job's,
ingest's."""

from __future__ import annotations

import pytest

from feature_jobs.job import build_job
from feature_jobs.settings import FeatureSettings
from feature_jobs.views import VIEWS
from ingest.settings import IngestSettings
from streams.app import create_app
from streams.settings import Settings

BIND_VARS = (
    "TICKETFLOW_WEB_BIND",
    "TICKETFLOW_INGEST_HOST",
    "TICKETFLOW_INGEST_URL",
)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch, tmp_path):
    for name in BIND_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)  # no .env of the checkout


def test_the_worker_web_view_binds_loopback_by_default():
    s = Settings()
    assert s.web_bind == "127.0.0.1"
    app = create_app(s, app_id="loopback-test")
    assert app.conf.web_bind == "127.0.0.1"
    assert str(app.conf.web_host) == "127.0.0.1"


def test_the_feature_job_web_server_binds_loopback_by_default():
    app = build_job(Settings(), FeatureSettings(), VIEWS)
    assert app.conf.web_bind == "127.0.0.1"
    assert app.conf.web_port == FeatureSettings().web_port


def test_ingest_binds_loopback_by_default():
    assert IngestSettings().host == "127.0.0.1"


def test_a_container_opts_in_to_every_interface(monkeypatch):
    monkeypatch.setenv("TICKETFLOW_WEB_BIND", "0.0.0.0")
    assert create_app(Settings(), app_id="loopback-test2").conf.web_bind == "0.0.0.0"
