"""Triton Python-backend model of `ticket_classifier` v2: TEXT [B, 1] bytes -> SCORES [B, 6] fp32.

multilingual-e5-small sentence embeddings (onnxruntime) + a linear head. This file is the
template: `python -m training.train` builds ticket_classifier/2/ (encoder.onnx,
tokenizer.json, head.npz, copies of e5_tokenizer.py and e5_runtime.py) and copies this file in
last, as model.py, so a repository where v2 was never built (or failed to build) has no 2/
and Triton serves v1 alone rather than failing to start. The version directory runs in any
Triton whose Python has numpy and onnxruntime (the GPU image of docker-compose adds
onnxruntime-gpu); on a GPU instance the encoder runs on that GPU (CUDA execution provider).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

try:  # the copy next to this file: the stub puts the version directory on sys.path
    import e5_runtime
except ImportError:  # pragma: no cover - only without a trained copy
    from inference_gateway.model import e5_runtime


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        model_dir = Path(args["model_repository"])
        version_dir = model_dir / args["model_version"]
        gpu = args.get("model_instance_kind") == "GPU"
        device = int(args.get("model_instance_device_id") or 0) if gpu else None
        self.classifier = e5_runtime.Classifier(version_dir, device_id=device)
        labels = self.classifier.labels
        config = json.loads(args["model_config"])
        dims = pb_utils.get_output_config_by_name(config, "SCORES")["dims"]
        if [int(d) for d in dims] != [len(labels)]:
            raise ValueError(f"SCORES dims {dims} but the model has {len(labels)} labels")
        labels_file = model_dir / "labels.txt"
        if labels_file.exists() and labels_file.read_text("utf-8").split() != labels:
            raise ValueError(f"labels.txt disagrees with the head's labels {labels}")

    def execute(self, requests: list) -> list:
        # one encoder pass over every row of every request Triton's batcher gathered
        texts: list[str] = []
        sizes: list[int] = []
        for request in requests:
            rows = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy().reshape(-1)
            texts += [_decode(x) for x in rows]
            sizes.append(len(rows))
        scores = self.classifier.predict_proba(texts)
        responses = []
        for part in np.split(scores, np.cumsum(sizes)[:-1]):
            out = pb_utils.Tensor("SCORES", np.ascontiguousarray(part, dtype=np.float32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses

    def finalize(self) -> None:
        self.classifier = None


def _decode(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)
