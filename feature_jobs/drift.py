"""Drift checks: recent feature values against a reference profile, with Great Expectations.

Once a period the checker samples entities the feature job updated lately, reads their
features through the online reader (what serving sees), drops the rows that came back as
fallbacks (a degraded store must not look like drifted data), and judges each feature:

* numeric (`int`, `float`): the mean may move at most 15 % from the reference mean (and at
  least three standard errors, so a small sample does not cry wolf) - GE
  `expect_column_mean_to_be_between`; the null rate may rise at most 5 points - GE
  `expect_column_values_to_not_be_null`; the population stability index over the
  reference's deciles must stay under 0.25 above its small-sample bias (0.1-0.25 is reported
  as a warning);
* categorical (`str`, `bool`, `list[str]`): at most 1 % of values outside the reference's
  set - GE `expect_column_values_to_be_in_set`; the PSI over the categories as above;
* timestamps: the null rate only.

Great Expectations is imported once (about 2 s) and runs in a worker thread on the sample,
never per event. Each check makes a `DriftReport`, sets `feature_drift_detected{view,feature}`
and is published to `features.drift` by its caller.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import numpy as np
import orjson
from pydantic import BaseModel, Field

from feature_jobs import metrics
from feature_jobs.reader import OnlineFeatureReader, SignatureMismatch
from feature_jobs.store import ViewKeys
from schemas.features import Feature, FeatureView
from schemas.tickets import DriftReport, FeatureValue, utcnow
from streams.redis_config import Target, async_client

log = logging.getLogger(__name__)

Kind = Literal["numeric", "categorical", "timestamp"]
REFERENCE_TTL_S = 90 * 24 * 3600
EPS = 1e-4
OTHER = "__other__"


@dataclass(frozen=True)
class Thresholds:
    mean_shift: float = 0.15  # relative change of the mean
    mean_min_se: float = 3.0  # ... and at least this many standard errors
    null_rate_rise: float = 0.05  # absolute rise of the null rate
    psi_warn: float = 0.10
    psi_drift: float = 0.25  # over the small-sample bias (bins - 1) * (1/n_ref + 1/n)
    unexpected_share: float = 0.01  # categorical values outside the reference set
    max_fallback_rate: float = 0.5  # above this the verdict is withheld: the store is degraded
    min_sample: int = 50
    bins: int = 10


def kind_of(feature: Feature) -> Kind:
    if feature.type in ("int", "float"):
        return "numeric"
    if feature.type == "timestamp":
        return "timestamp"
    return "categorical"


class FeatureProfile(BaseModel):
    kind: Kind
    count: int
    null_rate: float
    mean: float | None = None
    std: float | None = None
    # numeric: the inner bin edges (deciles); categorical: the categories
    edges: list[float] = Field(default_factory=list)
    categories: list[str] = Field(default_factory=list)
    fractions: list[float] = Field(default_factory=list)


class ReferenceProfile(BaseModel):
    view: str
    signature: str
    built_at: datetime = Field(default_factory=utcnow)
    sample_size: int
    features: dict[str, FeatureProfile]

    def to_json(self) -> bytes:
        return orjson.dumps(self.model_dump(mode="json"), option=orjson.OPT_INDENT_2)


# ---- statistics -----------------------------------------------------------------------------


def _numeric(values: Sequence[Any]) -> tuple[np.ndarray, int]:
    xs = [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return np.asarray(xs, dtype=float), len(values) - len(xs)


def _categorical(values: Sequence[Any]) -> tuple[list[str], int]:
    out: list[str] = []
    nulls = 0
    for v in values:
        if v is None:
            nulls += 1
        elif isinstance(v, list):
            out.extend(str(x) for x in v)
        else:
            out.append(str(v).lower() if isinstance(v, bool) else str(v))
    return out, nulls


def _bin_fractions(xs: np.ndarray, edges: list[float]) -> np.ndarray:
    idx = np.searchsorted(np.asarray(edges, dtype=float), xs, side="left")
    counts = np.bincount(idx, minlength=len(edges) + 1).astype(float)
    return counts / max(1.0, counts.sum())


def _cat_fractions(values: list[str], categories: list[str]) -> np.ndarray:
    index = {c: i for i, c in enumerate(categories)}
    counts = np.zeros(len(categories) + 1)
    for v in values:
        counts[index.get(v, len(categories))] += 1
    return counts / max(1.0, counts.sum())


def psi(reference: Sequence[float], current: Sequence[float]) -> float:
    """Population stability index: sum of (q - p) ln(q / p) over the bins."""
    p = np.clip(np.asarray(reference, dtype=float), EPS, None)
    q = np.clip(np.asarray(current, dtype=float), EPS, None)
    return float(np.sum((q - p) * np.log(q / p)))


def profile_feature(feature: Feature, values: Sequence[Any], bins: int = 10) -> FeatureProfile:
    kind = kind_of(feature)
    n = len(values)
    if kind == "numeric":
        xs, nulls = _numeric(values)
        if len(xs) == 0:
            return FeatureProfile(kind=kind, count=n, null_rate=nulls / max(1, n))
        qs = np.quantile(xs, np.linspace(0, 1, bins + 1)[1:-1])
        edges = sorted({float(q) for q in qs})
        return FeatureProfile(
            kind=kind,
            count=n,
            null_rate=nulls / max(1, n),
            mean=float(xs.mean()),
            std=float(xs.std(ddof=1)) if len(xs) > 1 else 0.0,
            edges=edges,
            fractions=_bin_fractions(xs, edges).tolist(),
        )
    if kind == "categorical":
        cats, nulls = _categorical(values)
        categories = sorted(set(cats))
        return FeatureProfile(
            kind=kind,
            count=n,
            null_rate=nulls / max(1, n),
            categories=categories,
            fractions=_cat_fractions(cats, categories).tolist(),
        )
    nulls = sum(v is None for v in values)
    return FeatureProfile(kind=kind, count=n, null_rate=nulls / max(1, n))


def build_reference(view: FeatureView, rows: Sequence[dict[str, Any]]) -> ReferenceProfile:
    """A reference profile from plain values (fallback rows already left out)."""
    return ReferenceProfile(
        view=view.name,
        signature=view.signature(),
        sample_size=len(rows),
        features={f.name: profile_feature(f, [r.get(f.name) for r in rows]) for f in view.features},
    )


# ---- Great Expectations ---------------------------------------------------------------------


class GreatExpectations:
    """One ephemeral GE context, made once; validations run one at a time."""

    _lock = threading.Lock()
    _shared: GreatExpectations | None = None

    def __init__(self) -> None:
        import great_expectations as gx
        from great_expectations.data_context.types.base import (
            DataContextConfig,
            InMemoryStoreBackendDefaults,
            ProgressBarsConfig,
        )

        self.gx = gx
        config = DataContextConfig(
            store_backend_defaults=InMemoryStoreBackendDefaults(),
            analytics_enabled=False,
            progress_bars=ProgressBarsConfig(globally=False, metric_calculations=False),
        )
        self.context = gx.get_context(mode="ephemeral", project_config=config)
        source = self.context.data_sources.add_pandas("ticketflow_features")
        asset = source.add_dataframe_asset("sample")
        self._batch = asset.add_batch_definition_whole_dataframe("whole")
        self._run_lock = threading.Lock()

    @classmethod
    def shared(cls) -> GreatExpectations:
        with cls._lock:
            if cls._shared is None:
                started = time.perf_counter()
                cls._shared = cls()
                log.info("great expectations loaded in %.1f s", time.perf_counter() - started)
            return cls._shared

    def validate(self, columns: dict[str, list[Any]], expectations: list[Any]) -> list[Any]:
        """Run expectations on a frame of the given columns; one result per expectation."""
        import pandas as pd

        if not expectations:
            return []
        frame = pd.DataFrame(columns)
        with self._run_lock:
            suite = self.gx.ExpectationSuite(name="ticketflow_drift")
            for e in expectations:
                suite.add_expectation(e)
            batch = self._batch.get_batch(batch_parameters={"dataframe": frame})
            return list(batch.validate(suite).results)


def preload_great_expectations() -> None:
    """Import GE and build its context ahead of the first check (it takes seconds)."""
    GreatExpectations.shared()


# ---- the check ------------------------------------------------------------------------------


def evaluate(
    view: FeatureView,
    reference: ReferenceProfile,
    rows: Sequence[dict[str, Any]],
    excluded_fallback: int,
    thresholds: Thresholds = Thresholds(),
    ge: GreatExpectations | None = None,
) -> DriftReport:
    """Judge real rows (fallbacks already left out) against the reference."""
    t = thresholds
    n = len(rows)
    total = n + excluded_fallback
    fallback_rate = excluded_fallback / total if total else 0.0
    features: dict[str, dict[str, Any]] = {}
    withheld = None
    if n < t.min_sample:
        withheld = f"only {n} real samples (fewer than {t.min_sample})"
    elif fallback_rate > t.max_fallback_rate:
        withheld = f"store degraded: {fallback_rate:.0%} of the sample were fallbacks"
    if withheld:
        for f in view.features:
            features[f.name] = {
                "drifted": False,
                "skipped": withheld,
                "fallback_rate": fallback_rate,
            }
        return _report(view, n, excluded_fallback, features)

    ge = ge or GreatExpectations.shared()
    gx = ge.gx.expectations
    row_columns: dict[str, list[Any]] = {}
    row_expectations: list[Any] = []
    cat_runs: list[tuple[str, list[str], list[Any]]] = []
    for f in view.features:
        ref = reference.features.get(f.name)
        values = [r.get(f.name) for r in rows]
        out: dict[str, Any] = {"kind": kind_of(f), "fallback_rate": fallback_rate, "reasons": []}
        features[f.name] = out
        if ref is None:
            out.update(drifted=False, skipped="not in the reference profile")
            continue
        null_rate = sum(v is None for v in values) / n
        out.update(null_rate=null_rate, reference_null_rate=ref.null_rate)
        col = f"f_{f.name}"
        mostly = max(0.0, 1.0 - min(1.0, ref.null_rate + t.null_rate_rise))
        if ref.kind == "numeric":
            xs, _ = _numeric(values)
            row_columns[col] = [
                float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None
                for v in values
            ]
            if mostly > 0:
                row_expectations.append(gx.ExpectColumnValuesToNotBeNull(column=col, mostly=mostly))
            if ref.mean is not None and len(xs):
                var = (ref.std or 0.0) ** 2
                se = math.sqrt(var / max(1, ref.count) + var / len(xs))
                tol = max(t.mean_shift * abs(ref.mean), t.mean_min_se * se)
                if tol == 0:
                    tol = t.mean_shift
                lo, hi = ref.mean - tol, ref.mean + tol
                row_expectations.append(
                    gx.ExpectColumnMeanToBeBetween(column=col, min_value=lo, max_value=hi)
                )
                mean = float(xs.mean())
                shift = (mean - ref.mean) / abs(ref.mean) if ref.mean else None
                value = _psi_against(ref, _bin_fractions(xs, ref.edges), len(xs), t)
                out.update(
                    mean=mean,
                    reference_mean=ref.mean,
                    mean_shift=shift,
                    mean_bounds=[lo, hi],
                    **value,
                )
        elif ref.kind == "categorical":
            cats, _ = _categorical(values)
            row_columns[col] = [None if v is None else 1 for v in values]
            if mostly > 0:
                row_expectations.append(gx.ExpectColumnValuesToNotBeNull(column=col, mostly=mostly))
            expected = [
                gx.ExpectColumnValuesToBeInSet(
                    column="value", value_set=ref.categories, mostly=1.0 - t.unexpected_share
                )
            ]
            cat_runs.append((f.name, cats, expected))
            unexpected = sorted({c for c in cats if c not in set(ref.categories)})
            value = _psi_against(ref, _cat_fractions(cats, ref.categories), len(cats), t)
            share = sum(c not in set(ref.categories) for c in cats) / max(1, len(cats))
            out.update(unexpected_values=unexpected[:20], unexpected_share=share, **value)
        else:
            row_columns[col] = [None if v is None else 1 for v in values]
            if mostly > 0:
                row_expectations.append(gx.ExpectColumnValuesToNotBeNull(column=col, mostly=mostly))

    results = ge.validate(row_columns, row_expectations)
    for res in results:
        name = res.expectation_config.kwargs["column"][2:]
        _record(features[name], res)
    for name, cats, expected in cat_runs:
        for res in ge.validate({"value": cats}, expected) if cats else []:
            _record(features[name], res)
    for out in features.values():
        if "skipped" in out:
            continue
        if out.get("psi_drifted"):
            out["reasons"].append(f"psi {out['psi']:.3f} > {out['psi_threshold']:.3f}")
        out["drifted"] = bool(out["reasons"])
    return _report(view, n, excluded_fallback, features)


def _psi_against(ref: FeatureProfile, fractions: np.ndarray, n: int, t: Thresholds) -> dict:
    if not ref.fractions or n == 0:
        return {}
    reference = list(ref.fractions)
    if len(fractions) == len(reference) + 1:  # categorical: the share of unseen values
        reference.append(0.0)
    value = psi(reference, fractions)
    bias = (len(reference) - 1) * (1.0 / max(1, ref.count) + 1.0 / n)
    threshold = t.psi_drift + bias
    return {
        "psi": value,
        "psi_threshold": threshold,
        "psi_warning": value >= t.psi_warn + bias,
        "psi_drifted": value > threshold,
    }


def _record(out: dict[str, Any], res: Any) -> None:
    kind = res.expectation_config.type
    checks = out.setdefault("expectations", {})
    checks[kind] = bool(res.success)
    if not res.success:
        observed = res.result.get("observed_value")
        if observed is None:
            observed = res.result.get("unexpected_percent")
        out["reasons"].append(f"{kind} failed (observed {observed})")


def _report(
    view: FeatureView, n: int, excluded: int, features: dict[str, dict[str, Any]]
) -> DriftReport:
    drifted = any(v.get("drifted") for v in features.values())
    for name, v in features.items():
        metrics.DRIFT.labels(view.name, name).set(1.0 if v.get("drifted") else 0.0)
    return DriftReport(
        view=view.name,
        sample_size=n,
        excluded_fallback=excluded,
        drifted=drifted,
        features=_jsonable(features),
    )


def _jsonable(value: Any) -> Any:
    return orjson.loads(orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY))


def split_fallbacks(
    rows: Sequence[dict[str, FeatureValue]],
) -> tuple[list[dict[str, Any]], int]:
    """Plain values of the rows served for real; how many rows had a fallback in them."""
    real, excluded = [], 0
    for row in rows:
        if any(v.is_fallback for v in row.values()):
            excluded += 1
        else:
            real.append({k: v.value for k, v in row.items()})
    return real, excluded


class DriftChecker:
    """Samples a view's recently updated entities and runs the checks on them."""

    def __init__(
        self,
        redis_url: Target,
        views: dict[str, FeatureView],
        key_prefix: str = "tf:fv",
        *,
        sample_size: int = 500,
        period_s: float = 300.0,
        thresholds: Thresholds = Thresholds(),
        read_timeout_s: float = 0.5,
    ) -> None:
        self.views = views
        self.thresholds = thresholds
        self.sample_size = sample_size
        self.period_s = period_s
        self._timeout = read_timeout_s
        self._keys = {name: ViewKeys.of(v, key_prefix) for name, v in views.items()}
        self._redis = async_client(redis_url, socket_timeout=2.0, socket_connect_timeout=1.0)
        # a reader of its own: no cache, and its reads stay out of the serving metrics
        self.reader = OnlineFeatureReader(
            redis_url,
            views,
            cache_ttl_s=0,
            key_prefix=key_prefix,
            record_metrics=False,
            retry_after_s=0.0,
        )

    async def sample(
        self, view: str, since_ms: int, until_ms: int | None = None, seed: int | None = None
    ) -> list[dict[str, FeatureValue]]:
        keys = self._keys[view]
        until = "+inf" if until_ms is None else until_ms
        entities = [
            e.decode() for e in await self._redis.zrangebyscore(keys.recent, since_ms, until)
        ]
        if len(entities) > self.sample_size:
            entities = random.Random(seed).sample(entities, self.sample_size)
        sem = asyncio.Semaphore(32)

        async def one(entity: str) -> dict[str, FeatureValue]:
            async with sem:
                return await self.reader.read(view, entity, self._timeout)

        return list(await asyncio.gather(*(one(e) for e in entities)))

    async def load_reference(self, view: str) -> ReferenceProfile | None:
        raw = await self._redis.get(self._keys[view].reference)
        return None if raw is None else ReferenceProfile.model_validate_json(raw)

    async def save_reference(self, reference: ReferenceProfile) -> None:
        keys = self._keys[reference.view]
        if reference.signature != keys.signature:
            raise ValueError(
                f"reference profile of {reference.view} was built under signature "
                f"{reference.signature[:16]}, the view's is {keys.tag}"
            )
        await self._redis.set(keys.reference, reference.to_json(), ex=REFERENCE_TTL_S)

    async def check(
        self,
        view: str,
        since_ms: int | None = None,
        until_ms: int | None = None,
        reference: ReferenceProfile | None = None,
        build_reference_if_missing: bool = True,
    ) -> DriftReport:
        """One check over the entities updated since `since_ms` (default: one period ago).

        Without a reference profile (none given, none stored) the first sufficient sample
        becomes the reference, and the report says so.
        """
        spec = self.views[view]
        now_ms = int(time.time() * 1000)
        since = now_ms - int(self.period_s * 1000) if since_ms is None else since_ms
        try:
            rows = await self.sample(view, since, until_ms)
        except SignatureMismatch as exc:
            return _report(
                spec, 0, 0, {f.name: {"drifted": False, "skipped": str(exc)} for f in spec.features}
            )
        real, excluded = split_fallbacks(rows)
        if reference is None:
            reference = await self.load_reference(view)
            if reference is not None:
                # keep a reference in use from expiring
                await self._redis.expire(self._keys[view].reference, REFERENCE_TTL_S)
        if reference is None:
            enough = len(real) >= self.thresholds.min_sample
            if build_reference_if_missing and enough:
                reference = build_reference(spec, real)
                await self.save_reference(reference)
                note = f"reference profile built from this sample ({len(real)} entities)"
            else:
                note = "no reference profile yet" + ("" if enough else ": sample too small")
            return _report(
                spec,
                len(real),
                excluded,
                {f.name: {"drifted": False, "skipped": note} for f in spec.features},
            )
        return await asyncio.to_thread(evaluate, spec, reference, real, excluded, self.thresholds)

    async def close(self) -> None:
        await self.reader.close()
        await self._redis.aclose()
