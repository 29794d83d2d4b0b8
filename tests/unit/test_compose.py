import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def test_compose_file_passes_the_compose_specification_schema():
    exe = shutil.which("check-jsonschema") or str(Path(sys.executable).parent / "check-jsonschema")
    proc = subprocess.run(
        [exe, "--builtin-schema", "vendor.compose-spec", str(ROOT / "docker-compose.yml")],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_compose_has_every_service_and_triton_reserves_a_gpu():
    spec = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = spec["services"]
    assert {"kafka", "redis", "triton", "gateway", "worker", "prometheus"} <= set(services)
    devices = services["triton"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["capabilities"] == ["gpu"]
