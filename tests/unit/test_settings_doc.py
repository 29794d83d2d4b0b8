"""docs/settings.md lists every setting, so the list cannot rot: every field of the settings
models (under each of the names it is read by) and every TICKETFLOW_* name the code reads."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import AliasChoices, BaseModel
from pydantic_settings import BaseSettings

from inference_gateway.config import GatewaySettings
from streams.settings import FeatureSettings, IngestSettings, Settings

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "settings.md"
NAME = re.compile(r"TICKETFLOW_[A-Z0-9_]*[A-Z0-9]")


def documented() -> set[str]:
    """The names in the first column of the doc's tables."""
    rows = (line for line in DOC.read_text(encoding="utf-8").splitlines() if line.startswith("|"))
    return {m.group(0) for row in rows for m in [NAME.search(row.split("|")[1])] if m}


def env_names(model: type[BaseSettings]) -> set[str]:
    prefix = model.model_config.get("env_prefix", "")
    out = set()
    for name, field in model.model_fields.items():
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            continue  # a nested group: its own model is checked
        alias = field.validation_alias
        if isinstance(alias, AliasChoices):
            out.update(str(c) for c in alias.choices)
        elif isinstance(alias, str):
            out.add(alias)
        else:
            out.add(f"{prefix}{name}".upper())
    return out


@pytest.mark.parametrize("model", [Settings, FeatureSettings, IngestSettings, GatewaySettings])
def test_every_field_of_the_settings_models_is_documented(model):
    missing = env_names(model) - documented()
    assert not missing, f"add to docs/settings.md: {sorted(missing)}"


def test_the_nested_groups_are_the_layers_models():
    s = Settings()
    assert isinstance(s.features, FeatureSettings) and isinstance(s.ingest, IngestSettings)


def test_every_name_the_code_reads_is_documented():
    read: set[str] = set()
    for folder in (
        "streams",
        "agents",
        "feature_jobs",
        "ingest",
        "ticketflow",
        "inference_gateway",
        "evaluation",
        "training",
    ):
        for path in (ROOT / folder).rglob("*.py"):
            text = path.read_text(encoding="utf-8")
            # whole names only: prefixes such as "TICKETFLOW_INGEST_" end in an underscore
            read.update(m.group(0) for m in re.finditer(r"TICKETFLOW_[A-Z0-9_]+", text)
                        if not m.group(0).endswith("_"))  # fmt: skip
    missing = read - documented()
    assert not missing, f"add to docs/settings.md: {sorted(missing)}"


def test_nothing_documented_is_made_up():
    known = set().union(
        *(env_names(m) for m in (Settings, FeatureSettings, IngestSettings, GatewaySettings))
    )
    extra = {"TICKETFLOW_KAFKA_SECURE_PORT", "TICKETFLOW_KAFKA_SECURE_CONTROLLER_PORT",
             "TICKETFLOW_REDIS_SECURE_PORT", "TICKETFLOW_ORT_THREADS"}  # fmt: skip
    assert documented() - known - extra == set()
