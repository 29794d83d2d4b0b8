"""Which partition a key goes to: the Java client's murmur2 partitioner, which Faust,
aiokafka and our librdkafka producers (`murmur2_random`) all use, so a record placed by
hand lands where a keyed produce of the same key would."""

from __future__ import annotations

from aiokafka.partitioner import murmur2


def partition_for(key: bytes, partitions: int) -> int:
    return (murmur2(key) & 0x7FFFFFFF) % partitions
