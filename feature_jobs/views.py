"""The feature views this deployment serves, loaded from data (`views.yaml`).

`TICKETFLOW_FEATURES_VIEWS_FILE` names another file (tests use it to change a definition).
"""

from __future__ import annotations

import os
from pathlib import Path

import yaml
from pydantic import ValidationError

from schemas.features import FeatureView

VIEWS_FILE = Path(__file__).with_name("views.yaml")
VIEWS_FILE_ENV = "TICKETFLOW_FEATURES_VIEWS_FILE"


class ViewsFileError(ValueError):
    pass


def load_views(path: Path | str | None = None) -> dict[str, FeatureView]:
    """The views of a YAML file (`views: [...]`), validated; a bad file is refused whole."""
    path = Path(path or os.environ.get(VIEWS_FILE_ENV) or VIEWS_FILE)
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ViewsFileError(f"{path}: {exc}") from exc
    items = doc.get("views") if isinstance(doc, dict) else None
    if not isinstance(items, list) or not items:
        raise ViewsFileError(f"{path}: expected a non-empty list under `views`")
    views: dict[str, FeatureView] = {}
    for i, item in enumerate(items):
        try:
            view = FeatureView.model_validate(item)
        except ValidationError as exc:
            raise ViewsFileError(f"{path}: views[{i}]: {exc}") from exc
        if view.name in views:
            raise ViewsFileError(f"{path}: view {view.name!r} is defined twice")
        views[view.name] = view
    return views


VIEWS: dict[str, FeatureView] = load_views()
USER_TICKET_STATS = VIEWS.get("user_ticket_stats")
