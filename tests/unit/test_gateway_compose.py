"""The Triton and gateway parts of docker-compose.yml (the schema check is test_compose.py)."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def services() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text(encoding="utf-8"))["services"]


def test_triton_serves_the_model_repository_on_a_gpu_with_onnxruntime() -> None:
    triton = services()["triton"]
    assert "./inference_gateway/model_repository:/models:ro" in triton["volumes"]
    assert "--model-repository=/models" in triton["command"]
    devices = triton["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia" and devices[0]["capabilities"] == ["gpu"]
    dockerfile = (ROOT / triton["build"]["context"] / "Dockerfile").read_text(encoding="utf-8")
    assert "nvcr.io/nvidia/tritonserver" in dockerfile and "onnxruntime-gpu" in dockerfile


def test_the_gateway_waits_for_triton_and_drains_on_stop() -> None:
    gateway = services()["gateway"]
    assert gateway["depends_on"]["triton"] == {"condition": "service_healthy"}
    assert "readyz" in " ".join(gateway["healthcheck"]["test"])
    assert gateway["stop_grace_period"] == "35s"  # longer than the gateway's 30 s drain


def test_prometheus_scrapes_every_service() -> None:
    config = yaml.safe_load((ROOT / "deploy" / "prometheus.yml").read_text(encoding="utf-8"))
    jobs = {job["job_name"] for job in config["scrape_configs"]}
    assert {"gateway", "worker", "features", "triton"} <= jobs
