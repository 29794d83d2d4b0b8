"""The records a step reads, with bundles (streams/bundles.py) opened into their parts.

A part stands in for the record it would have been: the bundle's topic, partition,
offset, timestamp and headers, its own key and value. Everything per ticket (decoding,
dead letters, bisecting a failing batch) sees parts; what belongs to the Faust event
(acknowledgement, the current event of a table write) goes to the bundle's event.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from streams.bundles import BadBundle, is_bundle, unpack


@dataclass(frozen=True, slots=True)
class PartMessage:
    topic: str
    partition: int
    offset: int
    timestamp: float
    headers: Any
    key: bytes
    value: bytes


@dataclass(frozen=True, slots=True)
class Part:
    message: PartMessage
    event: Any  # the Faust event of the bundle that carried it


def carrier(item: Any) -> Any:
    """The Faust event behind `item`: a part's bundle, or the event itself."""
    return item.event if isinstance(item, Part) else item


def open_bundles(events: Sequence[Any]) -> list[Any]:
    """`events` with each bundle replaced by its parts, in order. A record that claims to
    be a bundle and is not stays as it is: it then fails to decode as an envelope, and is
    dead-lettered alone, with its bytes, like any record that is not one."""
    out: list[Any] = []
    for event in events:
        msg = event.message
        if not is_bundle(msg.value):
            out.append(event)
            continue
        try:
            parts = unpack(msg.value)
        except BadBundle:
            out.append(event)
            continue
        for key, value in parts:
            part = PartMessage(
                msg.topic, msg.partition, msg.offset, msg.timestamp, msg.headers, key, value
            )
            out.append(Part(part, event))
    return out
