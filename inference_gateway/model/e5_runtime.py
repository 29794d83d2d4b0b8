"""Version 2 of the ticket classifier at run time: e5 sentence embeddings + a linear head.

numpy + onnxruntime (+ the copied `e5_tokenizer.py`); training/train.py copies this file next
to version 2's `model.py`, and training embeds the corpus through the same `Encoder`, so what
is evaluated is what is served.

A version directory holds `encoder.onnx` and `tokenizer.json` (from training/e5_export.py)
and `head.npz` (coef [384, 6], intercept [6], labels) learned by training/train.py.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

try:  # next to this file in the model repository, or in the package
    import e5_tokenizer
except ImportError:  # pragma: no cover - the package layout
    from inference_gateway.model import e5_tokenizer

HEAD_VERSION = 1


def softmax(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


class Encoder:
    """Texts -> L2-normalised 384-d embeddings, via onnxruntime.

    A batch is run in chunks of texts of similar length (sorted by token count), so that
    padding costs little: on a CPU the encoder's cost per token barely falls with batch
    size, so padding short texts to the longest of 64 would only waste work.
    """

    def __init__(
        self,
        model_dir: Path | str,
        *,
        device_id: int | None = None,
        threads: int | None = None,
        max_chunk_rows: int | None = None,
        max_chunk_tokens: int = 4096,
    ) -> None:
        import onnxruntime as ort

        model_dir = Path(model_dir)
        self.tokenizer = e5_tokenizer.Tokenizer.load(model_dir / "tokenizer.json")
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads or int(
            os.environ.get("TICKETFLOW_ORT_THREADS", 0) or (os.cpu_count() or 1)
        )
        options.inter_op_num_threads = 1
        # no busy-waiting between kernels: on a CPU shared with the gateway and the callers,
        # spinning threads starve them and each other (measured here under load: batch-1
        # throughput 12/s spinning against 56/s not)
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.log_severity_level = 3  # shape-merge warnings of the quantised graph: noise
        providers: list = ["CPUExecutionProvider"]
        if device_id is not None and "CUDAExecutionProvider" in ort.get_available_providers():
            providers.insert(0, ("CUDAExecutionProvider", {"device_id": device_id}))
        self.session = ort.InferenceSession(
            str(model_dir / "encoder.onnx"), options, providers=providers
        )
        self.on_gpu = self.session.get_providers()[0] == "CUDAExecutionProvider"
        self.max_chunk_rows = max_chunk_rows or (64 if self.on_gpu else 16)
        self.max_chunk_tokens = max_chunk_tokens
        self.dim = int(self.session.get_outputs()[0].shape[-1])

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        rows = [self.tokenizer.encode(t) for t in texts]
        out = np.empty((len(rows), self.dim), dtype=np.float32)
        order = sorted(range(len(rows)), key=lambda i: len(rows[i]))
        start = 0
        while start < len(order):
            stop = start + 1
            # grow the chunk while it stays within rows and (padded) tokens
            while (
                stop < len(order)
                and stop - start < self.max_chunk_rows
                and (stop - start + 1) * len(rows[order[stop]]) <= self.max_chunk_tokens
            ):
                stop += 1
            chunk = order[start:stop]
            out[chunk] = self._run([rows[i] for i in chunk])
            start = stop
        return out

    def _run(self, rows: list[list[int]]) -> np.ndarray:
        width = max(len(r) for r in rows)
        ids = np.full((len(rows), width), self.tokenizer.pad, dtype=np.int64)
        mask = np.zeros((len(rows), width), dtype=np.int64)
        for i, row in enumerate(rows):
            ids[i, : len(row)] = row
            mask[i, : len(row)] = 1
        return self.session.run(["EMBEDDING"], {"input_ids": ids, "attention_mask": mask})[0]


class Classifier:
    """Class probabilities [n, n_classes] from the encoder and the trained linear head."""

    def __init__(self, model_dir: Path | str, **encoder_options: object) -> None:
        model_dir = Path(model_dir)
        head = np.load(model_dir / "head.npz", allow_pickle=False)
        if int(head["head_version"]) != HEAD_VERSION:
            raise ValueError(f"head.npz v{int(head['head_version'])}, need v{HEAD_VERSION}")
        self.coef = np.ascontiguousarray(head["coef"], dtype=np.float32)
        self.intercept = head["intercept"].astype(np.float32)
        self.labels = [str(x) for x in head["labels"]]
        # encoder_options are Encoder's own keyword arguments, passed through untouched
        self.encoder = Encoder(model_dir, **encoder_options)  # type: ignore[arg-type]
        if self.coef.shape != (self.encoder.dim, len(self.labels)):
            raise ValueError(f"head coef {self.coef.shape} does not fit the encoder's outputs")

    def predict_proba(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, len(self.labels)), np.float32)
        logits = self.encoder.embed(texts) @ self.coef + self.intercept
        return softmax(logits).astype(np.float32)
