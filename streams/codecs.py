"""Record codecs: pydantic models to JSON bytes and back, validated once at the edge."""

from __future__ import annotations

from typing import TypeVar

from pydantic import BaseModel

M = TypeVar("M", bound=BaseModel)


def encode(record: BaseModel) -> bytes:
    # pydantic-core serialises straight to bytes in Rust: no dict round trip
    return record.model_dump_json().encode()


def decode(model: type[M], data: bytes | str) -> M:
    return model.model_validate_json(data)
