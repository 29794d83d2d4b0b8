"""Record codecs: pydantic models to JSON bytes and back, validated once at the edge."""

from __future__ import annotations

from typing import TypeVar

from pydantic import BaseModel

M = TypeVar("M", bound=BaseModel)


def encode(record: BaseModel) -> bytes:
    # pydantic-core serialises straight to bytes in Rust: no dict round trip, and no str
    # (`model_dump_json` decodes those bytes to a str, which would be encoded back here)
    return type(record).__pydantic_serializer__.to_json(record)


def decode(model: type[M], data: bytes | str) -> M:
    return model.model_validate_json(data)
