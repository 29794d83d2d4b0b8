"""Settings of the data layer, from `TICKETFLOW_FEATURES_*` variables (or `.env`).

Kafka, Redis and the topic prefix come from `streams.settings.Settings`; these are the knobs
only the feature jobs, the reader and the drift checks have.
"""

from __future__ import annotations

from functools import lru_cache

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class FeatureSettings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="TICKETFLOW_FEATURES_", env_file=".env", extra="ignore"
    )

    # every key the data layer writes starts with this (a test or a second deployment on
    # the same Redis takes another)
    key_prefix: str = "tf:fv"
    # the feature job's Faust web port (/metrics, /ready); the workflow worker has 6066
    web_port: int = 6067
    # events per Redis pipeline, and the longest wait to fill one
    batch_size: int = Field(500, ge=1, le=10_000)
    batch_within_s: float = Field(0.05, gt=0)
    # the reader's in-process cache
    cache_ttl_s: float = Field(2.0, ge=0)
    # drift checks: how often, over how many entities, and the least sample worth judging
    drift_period_s: float = Field(300.0, gt=0)
    drift_sample_size: int = Field(500, ge=1)
    drift_min_sample: int = Field(50, ge=1)
    drift_enabled: bool = True


@lru_cache(maxsize=1)
def get_feature_settings() -> FeatureSettings:
    return FeatureSettings()
