"""Several keyed records in one Kafka record: how a step hands a batch to the next step.

A step's batch fans out to the next step's topic; the envelopes that go to one partition
travel as one record, so a hop costs one produce, one fetch, one Faust event and one
acknowledgement per batch and partition instead of per ticket. Each part keeps its own
key and value, so a reader sees the records it would have read one by one and can
dead-letter one part alone, with its own bytes (docs/workflow.md, "Records per ticket").

The framing is length-prefixed, not JSON: splitting a bundle parses nothing, and each
part is then validated exactly as a record of its own would be. A record that starts with
`MAGIC` but is not a well-formed bundle raises `BadBundle` as a whole.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence

# JSON never starts with a NUL byte, so no envelope or ticket is mistaken for a bundle
MAGIC = b"\x00tfb1"
# a reader refuses more parts than a step's batch ever holds, whatever the record claims
MAX_PARTS = 4096
_SIZES = struct.Struct(">II")  # key length, value length
Part = tuple[bytes, bytes]  # (key, value)


class BadBundle(ValueError):
    """A record that claims to be a bundle and is not a well-formed one."""


def is_bundle(value: object) -> bool:
    return isinstance(value, bytes) and value.startswith(MAGIC)


def pack(parts: Sequence[Part]) -> bytes:
    out = [MAGIC]
    for key, value in parts:
        out.append(_SIZES.pack(len(key), len(value)))
        out.append(key)
        out.append(value)
    return b"".join(out)


def unpack(record: bytes) -> list[Part]:
    """The (key, value) parts of a bundle, in order; BadBundle if it is malformed."""
    if not is_bundle(record):
        raise BadBundle("not a bundle")
    view, at = memoryview(record), len(MAGIC)
    parts: list[Part] = []
    end = len(record)
    while at < end:
        if len(parts) >= MAX_PARTS:
            raise BadBundle(f"more than {MAX_PARTS} parts")
        if at + _SIZES.size > end:
            raise BadBundle("truncated part header")
        key_len, value_len = _SIZES.unpack_from(view, at)
        at += _SIZES.size
        if at + key_len + value_len > end:
            raise BadBundle("a part runs past the end of the record")
        parts.append(
            (bytes(view[at : at + key_len]), bytes(view[at + key_len : at + key_len + value_len]))
        )
        at += key_len + value_len
    if not parts:
        raise BadBundle("no parts")
    return parts


def chunks(parts: Sequence[Part], max_bytes: int) -> Iterator[list[Part]]:
    """`parts` in runs whose bundle stays within `max_bytes` (a part larger than that
    alone is a run of its own)."""
    run: list[Part] = []
    size = len(MAGIC)
    for key, value in parts:
        n = _SIZES.size + len(key) + len(value)
        if run and size + n > max_bytes:
            yield run
            run, size = [], len(MAGIC)
        run.append((key, value))
        size += n
    if run:
        yield run
