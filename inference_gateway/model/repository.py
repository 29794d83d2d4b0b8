"""The model repository as the serving side reads it: where `ticket_classifier`'s versions
live, and what a built version says about itself (its `build.json`).

Training (training/builds.py) writes `build.json`; rollout and `ticketflow model ls` read it
back here, so that serving never imports the training package.
"""

from __future__ import annotations

import json
from pathlib import Path

MODEL_DIR = Path(__file__).resolve().parent.parent / "model_repository" / "ticket_classifier"
BUILD_FILE = "build.json"


def read_build(version_dir: Path) -> dict:
    """A version directory's build.json, {} for the versions training/train.py built (1, 2)."""
    try:
        return json.loads((version_dir / BUILD_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
