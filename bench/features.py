"""The feature layer's benchmark, runnable without the CLI: `python bench/features.py --help`.

Same as `ticketflow bench features` (feature_jobs.bench has the method); results go to
bench/results/features.json and features.png.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import typer

from feature_jobs.cli import bench_features

if __name__ == "__main__":
    typer.run(bench_features)
