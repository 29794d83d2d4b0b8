"""Variants (a) and (b) of `ticketflow bench pipeline`, each in a process of its own so that
the benchmark reads their CPU time apart from its own producer and results consumer:

    python -m benchmarks.variants relay T0 T1 ... T6     (a) the raw relay chain
    python -m benchmarks.variants naive SOURCE SINK      (b) the naive single function

Both run until SIGTERM. Settings come from the environment, as the worker's do.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import signal

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from agents.steps.clean import clean_text
from agents.steps.rules import RuleInput, apply_rules
from agents.steps.validate import parse_ticket
from feature_jobs.reader import OnlineFeatureReader
from feature_jobs.views import VIEWS
from inference_gateway.client import GatewayClient
from schemas.gateway import PredictInput
from schemas.tickets import Category, Context, Prediction
from streams.kafka_config import aiokafka_kwargs
from streams.settings import Settings, get_settings

# Fresh topics each run: this process may join after the bench's first warm-up tickets were
# published, and they are its to relay.
OFFSET_RESET = "earliest"


async def relay(settings: Settings, topics: list[str], stop: asyncio.Event) -> None:
    """(a): each hop copies its topic to the next, doing no work."""
    producer = AIOKafkaProducer(**aiokafka_kwargs(settings), linger_ms=1)
    await producer.start()
    consumers = []
    for src, dst in itertools.pairwise(topics):
        c = AIOKafkaConsumer(
            src,
            **aiokafka_kwargs(settings),
            group_id=f"relay-{src}",
            auto_offset_reset=OFFSET_RESET,
        )
        await c.start()
        consumers.append((c, dst))

    async def hop(c: AIOKafkaConsumer, dst: str) -> None:
        while not stop.is_set():
            for msgs in (await c.getmany(timeout_ms=100)).values():
                for m in msgs:
                    await producer.send(dst, key=m.key, value=m.value)

    try:
        await asyncio.gather(*(hop(c, d) for c, d in consumers))
    finally:
        for c, _ in consumers:
            await c.stop()
        await producer.stop()


async def naive(settings: Settings, source: str, sink: str, stop: asyncio.Event) -> None:
    """(b): one consumer doing every step in one function, one gateway call per ticket."""
    consumer = AIOKafkaConsumer(
        source,
        **aiokafka_kwargs(settings),
        group_id=f"naive-{source}",
        auto_offset_reset=OFFSET_RESET,
    )
    producer = AIOKafkaProducer(**aiokafka_kwargs(settings))
    reader = OnlineFeatureReader(settings.redis, VIEWS)
    gateway = GatewayClient(settings.gateway_url)
    await consumer.start()
    await producer.start()
    try:
        while not stop.is_set():
            for msgs in (await consumer.getmany(timeout_ms=100)).values():
                for m in msgs:  # every step, in order, one ticket at a time
                    ticket = parse_ticket(m.value, settings.max_record_bytes)
                    text = clean_text(ticket.text)
                    await reader.read("user_ticket_stats", ticket.user_id, 0.8)
                    resp = await gateway.predict(
                        "ticket_classifier",
                        [PredictInput(id=ticket.ticket_id, text=text)],
                        timeout_ms=300,
                    )
                    out = resp.outputs[0]
                    ctx = Context(
                        prediction=Prediction(
                            category=Category(out.label),
                            confidence=out.confidence,
                            model_name=resp.model,
                            model_version=resp.version,
                        )
                    )
                    apply_rules(["refund_check", "score_threshold"], RuleInput(text, ctx, 0.5))
                    await producer.send_and_wait(sink, key=m.key, value=m.value)
    finally:
        await consumer.stop()
        await producer.stop()
        await gateway.close()
        await reader.close()


async def _until_sigterm(args: argparse.Namespace) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    settings = get_settings()
    if args.variant == "relay":
        await relay(settings, args.topics, stop)
    else:
        await naive(settings, args.topics[0], args.topics[1], stop)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.variants")
    parser.add_argument("variant", choices=["relay", "naive"])
    parser.add_argument("topics", nargs="+", help="relay: the chain's topics; naive: in, out")
    args = parser.parse_args(argv)
    if args.variant == "naive" and len(args.topics) != 2:
        parser.error("naive takes two topics: its source and its sink")
    asyncio.run(_until_sigterm(args))


if __name__ == "__main__":
    main()
