"""The Grafana dashboard, offline: its layout, its data source, and PromQL that parses.

tests/integration/test_dashboard.py asks a live Prometheus for data; this checks what can be
checked without one, so a broken panel fails `make test-unit` too.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
GRAFANA = ROOT / "deploy" / "grafana"
DASHBOARD = GRAFANA / "dashboards" / "ticketflow.json"


def _spec() -> dict:
    return json.loads(DASHBOARD.read_text())


def _exprs() -> list[str]:
    return [t["expr"] for p in _spec()["panels"] for t in p.get("targets", [])]


def test_one_row_per_layer_in_order_each_with_panels() -> None:
    panels = _spec()["panels"]
    rows = [i for i, p in enumerate(panels) if p["type"] == "row"]
    titles = [panels[i]["title"].split(":")[0].lower() for i in rows]
    assert titles == ["access", "workflow", "inference", "data"]
    for start, end in zip(rows, [*rows[1:], len(panels)], strict=True):
        assert end - start > 3, panels[start]["title"]  # at least three panels a row


def test_panels_have_unique_ids_and_do_not_overlap() -> None:
    panels = _spec()["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    cells = set()
    for p in panels:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24, p["title"]
        mine = {
            (x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])
        }
        assert not cells & mine, f"{p['title']} overlaps another panel"
        cells |= mine


def test_every_query_names_the_provisioned_data_source() -> None:
    source = yaml.safe_load(
        (GRAFANA / "provisioning" / "datasources" / "prometheus.yml").read_text()
    )
    [ds] = source["datasources"]
    assert ds["type"] == "prometheus" and ds["url"] == "http://prometheus:9090"
    for p in _spec()["panels"]:
        for t in p.get("targets", []):
            assert t["datasource"] == {"type": "prometheus", "uid": ds["uid"]}, p["title"]


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool missing: `make setup`")
def test_every_query_parses(tmp_path: Path) -> None:
    # promtool parses PromQL offline only inside rules: one recording rule per panel query
    rules = [{"record": f"panel:q{i}", "expr": e} for i, e in enumerate(_exprs())]
    path = tmp_path / "panels.rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "panels", "rules": rules}]}))
    proc = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(rules)} rules found" in proc.stdout


def test_compose_provisions_grafana_with_the_dashboard() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    grafana = compose["services"]["grafana"]
    assert "./deploy/grafana/provisioning:/etc/grafana/provisioning:ro" in grafana["volumes"]
    assert "./deploy/grafana/dashboards:/var/lib/grafana/dashboards:ro" in grafana["volumes"]
    provider = yaml.safe_load(
        (GRAFANA / "provisioning" / "dashboards" / "ticketflow.yml").read_text()
    )
    assert provider["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"
    env = grafana["environment"]
    # no password in the file: Grafana reads it from a compose secret
    assert env["GF_SECURITY_ADMIN_PASSWORD__FILE"] == "/run/secrets/grafana_admin_password"
    assert "GF_SECURITY_ADMIN_PASSWORD" not in env
    assert compose["secrets"]["grafana_admin_password"]["file"].startswith("./deploy/secrets/")
    assert "grafana_admin_password" in (ROOT / "deploy" / "compose-secrets.sh").read_text()
