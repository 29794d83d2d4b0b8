"""The inference layer's benchmark, runnable without the CLI: `python bench/gateway.py --help`.

Same as `ticketflow bench gateway` (inference_gateway.bench has the method); results go to
bench/results/gateway.json and gateway.png.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import typer

from inference_gateway.cli import bench_gateway

if __name__ == "__main__":
    typer.run(bench_gateway)
