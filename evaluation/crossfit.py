"""`ticketflow eval crossfit`: the cascade's and the intent head's decisions on each spent
blind set, made by models that never saw it.

For each set of `earlier_sets.SETS` ("a fold"), v1, v2's head and the intent head are
trained as `make model` trains them, but without that set, and score it: out-of-fold
decisions on ~2,500 hand-written tickets. `ticketflow eval decisions --choose --on
crossfit` chooses the intent band on them, since a band chosen on the generated tickets of
the validation split does not transfer to what people write (docs/blind14.md).

v2's encoder is the served one (never trained here); its embeddings of the corpus rows and
of every spent set are computed once and shared by the folds, so a fold costs its three
fits and the head's calibration (~25 s on 2 cores; ~4.5 min for ten folds).

    ticketflow eval crossfit [--out bench/results/crossfit.json] [--set blind14_frozen ...]
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Annotated

import numpy as np
import typer

from schemas.tickets import CATEGORIES

from . import after_sales as ev
from .decisions import CROSSFIT

OUT = CROSSFIT  # read back by decisions.load_crossfit


def _v1(folder: Path, rows: list[dict]) -> None:
    from training import train

    labels = [CATEGORIES.index(r["category"]) for r in rows]
    texts = [r["text"] for r in rows]
    coef, intercept = train.fit(texts, labels)
    train.export(coef, intercept, folder, texts[:256])  # weights.npz, as version 1's


def _v2(folder: Path, rows: list[dict], table: dict[str, np.ndarray]) -> None:
    from training import train

    folder.mkdir(parents=True)
    for name in train.V2_ENCODER_FILES:  # the served encoder, linked
        os.symlink(train.V2_OUT / name, folder / name)
    x = np.stack([table[r["text"]] for r in rows])
    y = np.array([CATEGORIES.index(r["category"]) for r in rows])
    coef, intercept, _ = train.fit_head(x, y)
    train.save_head(folder, coef, intercept)


def _embeddings(texts: list[str]) -> dict[str, np.ndarray]:
    from inference_gateway.model import e5_runtime
    from training import train

    distinct = list(dict.fromkeys(texts))
    return dict(zip(distinct, e5_runtime.Encoder(train.V2_OUT).embed(distinct), strict=True))


def fold(name: str, work: Path, table: dict[str, np.ndarray], below: float) -> list[dict]:
    """The decisions on spent set `name` by models trained without it."""
    from agents.steps.refund_intent import read_head
    from training import earlier_sets, intent, train

    from .decisions import intent_scores, scored

    with earlier_sets.leaving_out(name):
        rows, _ = train.split()
        _v1(work / "1", earlier_sets.weighted(rows))
        _v2(work / "2", earlier_sets.weighted(rows[: train.V2_N_TRAIN]), table)
        intent.train_intent(work / "intent", model_dir=work)
    head = read_head(work / "intent" / "intent.npz")
    cases = ev.load_cases(earlier_sets.FIXTURES / f"{name}.jsonl")
    proba, versions = scored("cascade", below, [c.text for c in cases], work)
    scores = intent_scores(cases, proba, versions, head)
    return [
        {"set": name, "id": c.id, "proba": [round(float(p), 6) for p in row], "version": v,
         "intent": round(float(s), 6)}
        for c, row, v, s in zip(cases, proba, versions, scores, strict=True)
    ]  # fmt: skip


def run(below: float, sets: list[str] | None = None) -> dict:
    """The folds of `sets` (default: every spent set)."""
    from training import earlier_sets, train

    folds = sets or list(earlier_sets.SETS)
    unknown = set(folds) - set(earlier_sets.SETS)
    if unknown:
        raise ValueError(f"not spent sets: {sorted(unknown)}")
    t0 = time.perf_counter()
    rows, _ = train.split()
    spent = [r["text"] for r in earlier_sets.rows()]
    table = _embeddings([r["text"] for r in rows[: train.V2_N_TRAIN]] + spent)
    out: list[dict] = []
    for name in folds:
        with tempfile.TemporaryDirectory(prefix=f"crossfit-{name}-") as tmp:
            t = time.perf_counter()
            out += fold(name, Path(tmp), table, below)
            typer.echo(f"{name}: {time.perf_counter() - t:.0f} s", err=True)
    return {"below": below, "folds": folds, "rows": out,
            "seconds": round(time.perf_counter() - t0, 1)}  # fmt: skip


def crossfit(
    out: Annotated[Path, typer.Option(help="the out-of-fold decisions (JSON)")] = OUT,
    below: Annotated[
        float | None, typer.Option(help="the cascade's threshold (default: the workflow's)")
    ] = None,
    sets: Annotated[
        list[str] | None, typer.Option("--set", help="one fold (repeat; default: every set)")
    ] = None,
) -> None:
    """Out-of-fold decisions on each spent blind set, by models trained without it."""
    from .decisions import workflow_below

    if not (ev.MODEL_DIR / "2" / "encoder.onnx").exists():
        typer.echo("v2's encoder is not built: `make model` first")
        raise typer.Exit(2)
    result = run(workflow_below() if below is None else below, sets)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result) + "\n")
    typer.echo(f"{len(result['rows'])} tickets of {len(result['folds'])} sets in "
               f"{result['seconds']:.0f} s -> {out}")  # fmt: skip
