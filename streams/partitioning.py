"""Which partition a key goes to: the Java client's murmur2 partitioner, which Faust,
aiokafka and our librdkafka producers (`murmur2_random`) all use, so a record placed by
hand lands where a keyed produce of the same key would."""

from __future__ import annotations

from functools import lru_cache

from aiokafka.partitioner import murmur2


def partition_for(key: bytes, partitions: int) -> int:
    return _positive_hash(key) % partitions


# a ticket's key is placed once at every hop, and murmur2 runs in Python (~5 µs a key)
@lru_cache(maxsize=16_384)
def _positive_hash(key: bytes) -> int:
    return murmur2(key) & 0x7FFFFFFF
