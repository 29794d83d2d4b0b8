"""The feature views this deployment serves, loaded from data (`views.yaml`).

`TICKETFLOW_FEATURES_VIEWS_FILE` (FeatureSettings.views_file) names another file (tests use it
to change a definition). `VIEWS` is read on first use, not at import: importing a module
never reads a file or the environment, and a bad file fails the command that needs it.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from schemas.features import FeatureView

VIEWS_FILE = Path(__file__).with_name("views.yaml")
VIEWS_FILE_ENV = "TICKETFLOW_FEATURES_VIEWS_FILE"


class ViewsFileError(ValueError):
    pass


def load_views(path: Path | str | None = None) -> dict[str, FeatureView]:
    """The views of a YAML file (`views: [...]`), validated; a bad file is refused whole."""
    if path is None:
        from streams.settings import FeatureSettings

        path = FeatureSettings().views_file
    path = Path(path or VIEWS_FILE)
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


@cache
def _default_views() -> dict[str, FeatureView]:
    return load_views()


def __getattr__(name: str) -> Any:
    # `from feature_jobs.views import VIEWS` keeps working; the file is read once, on first use
    if name == "VIEWS":
        return _default_views()
    if name == "USER_TICKET_STATS":
        return _default_views().get("user_ticket_stats")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
