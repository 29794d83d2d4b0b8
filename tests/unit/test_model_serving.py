"""The Triton Python-backend model.py of ticket_classifier, with a stand-in for pb_utils."""

from __future__ import annotations

import importlib.util
import json
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from inference_gateway.model import featurize
from schemas.tickets import CATEGORIES

MODEL_DIR = Path(featurize.__file__).resolve().parents[1] / "model_repository" / "ticket_classifier"


class _Tensor:
    def __init__(self, name: str, array: np.ndarray) -> None:
        self.name, self.array = name, array

    def as_numpy(self) -> np.ndarray:
        return self.array


class _Response:
    def __init__(self, output_tensors: list[_Tensor]) -> None:
        self.outputs = output_tensors


def _fake_pb_utils() -> types.ModuleType:
    pb = types.ModuleType("triton_python_backend_utils")
    pb.Tensor = _Tensor
    pb.InferenceResponse = _Response
    pb.get_input_tensor_by_name = lambda request, name: request[name]
    pb.get_output_config_by_name = lambda config, name: next(
        o for o in config["output"] if o["name"] == name
    )
    return pb


@pytest.fixture()
def model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", _fake_pb_utils())
    spec = importlib.util.spec_from_file_location("tc_model", MODEL_DIR / "1" / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    # Random weights in a throw-away repository: the contract, not the learned values.
    rng = np.random.default_rng(1)
    (tmp_path / "1").mkdir()
    np.savez(
        tmp_path / "1" / "weights.npz",
        coef=rng.normal(size=(featurize.N_FEATURES, 6)).astype(np.float32),
        intercept=np.zeros(6, np.float32),
        labels=np.array(CATEGORIES),
        featurizer_version=np.int64(featurize.VERSION),
        n_features=np.int64(featurize.N_FEATURES),
    )
    (tmp_path / "labels.txt").write_text("\n".join(CATEGORIES) + "\n", encoding="utf-8")
    config = {"output": [{"name": "SCORES", "dims": ["6"]}]}
    m = module.TritonPythonModel()
    m.initialize(
        {
            "model_repository": str(tmp_path),
            "model_version": "1",
            "model_config": json.dumps(config),
        }
    )
    return m


def test_execute_vectorises_across_requests(model) -> None:
    batches = [["I was charged twice"], ["包裹没收到".encode(), b"refund", b""]]
    requests = [
        {"TEXT": _Tensor("TEXT", np.array([[t] for t in b], dtype=object))} for b in batches
    ]
    responses = model.execute(requests)
    assert len(responses) == 2
    scores = [r.outputs[0].as_numpy() for r in responses]
    assert [s.shape for s in scores] == [(1, 6), (3, 6)]
    assert all(s.dtype == np.float32 for s in scores)
    flat = [t if isinstance(t, str) else t.decode() for b in batches for t in b]
    expected = featurize.predict_proba(flat, model.coef, model.intercept)
    np.testing.assert_allclose(np.concatenate(scores), expected, rtol=1e-6)


def test_labels_mismatch_fails_loading(model, tmp_path: Path) -> None:
    (tmp_path / "labels.txt").write_text("a\nb\nc\nd\ne\nf\n", encoding="utf-8")
    config = {"output": [{"name": "SCORES", "dims": ["6"]}]}
    with pytest.raises(ValueError, match=r"labels\.txt"):
        model.initialize(
            {
                "model_repository": str(tmp_path),
                "model_version": "1",
                "model_config": json.dumps(config),
            }
        )


def test_repository_labels_file_is_category_order() -> None:
    assert tuple((MODEL_DIR / "labels.txt").read_text("utf-8").split()) == CATEGORIES
    config = (MODEL_DIR / "config.pbtxt").read_text("utf-8")
    assert 'name: "ticket_classifier"' in config and "dims: [ 6 ]" in config
