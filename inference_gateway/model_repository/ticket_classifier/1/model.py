"""Triton Python-backend model of `ticket_classifier`: TEXT [B, 1] bytes -> SCORES [B, 6] fp32.

Reads weights.npz and the featurizer copied next to this file by `training.train`,
so the version directory runs in any Triton with the Python backend and numpy (e.g. the NGC
image); the installed package is only a fallback for a featurizer that was not copied.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

try:  # the copy next to this file: the stub puts the version directory on sys.path
    import featurize
except ImportError:  # pragma: no cover - only without a trained copy
    from inference_gateway.model import featurize


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        model_dir = Path(args["model_repository"])
        weights = np.load(model_dir / args["model_version"] / "weights.npz", allow_pickle=False)
        self.coef = np.ascontiguousarray(weights["coef"], dtype=np.float32)
        self.intercept = weights["intercept"].astype(np.float32)
        self.labels = [str(x) for x in weights["labels"]]
        self._check(weights, model_dir, json.loads(args["model_config"]))

    def _check(self, weights: np.lib.npyio.NpzFile, model_dir: Path, config: dict) -> None:
        """Fail loading, not serving, when weights, featurizer and config disagree."""
        if int(weights["featurizer_version"]) != featurize.VERSION:
            raise ValueError(
                f"weights need featurizer v{int(weights['featurizer_version'])}, "
                f"have v{featurize.VERSION}"
            )
        if self.coef.shape != (int(weights["n_features"]), len(self.labels)):
            raise ValueError(f"coef shape {self.coef.shape} does not match n_features/labels")
        dims = pb_utils.get_output_config_by_name(config, "SCORES")["dims"]
        if [int(d) for d in dims] != [len(self.labels)]:
            raise ValueError(f"SCORES dims {dims} but the model has {len(self.labels)} labels")
        labels_file = model_dir / "labels.txt"
        if labels_file.exists() and labels_file.read_text("utf-8").split() != self.labels:
            raise ValueError(f"labels.txt disagrees with the weights' labels {self.labels}")

    def execute(self, requests: list) -> list:
        # One featurize + scoring pass over every row of every request the batcher gathered.
        texts: list[str] = []
        sizes: list[int] = []
        for request in requests:
            rows = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy().reshape(-1)
            texts += [_decode(x) for x in rows]
            sizes.append(len(rows))
        scores = featurize.predict_proba(texts, self.coef, self.intercept)
        responses = []
        for part in np.split(scores, np.cumsum(sizes)[:-1]):
            out = pb_utils.Tensor("SCORES", np.ascontiguousarray(part, dtype=np.float32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses

    def finalize(self) -> None:
        self.coef = self.intercept = None


def _decode(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)
