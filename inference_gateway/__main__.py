"""`python -m inference_gateway`: serve the gateway; flags override TICKETFLOW_* variables."""

from __future__ import annotations

import argparse
import logging

from inference_gateway.server import run


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m inference_gateway", description=__doc__)
    parser.add_argument("--host", help="address to bind (default: host of TICKETFLOW_GATEWAY_URL)")
    parser.add_argument("--port", type=int, help="port (default: port of TICKETFLOW_GATEWAY_URL)")
    parser.add_argument(
        "--triton-url", help="Triton gRPC host:port (default: TICKETFLOW_TRITON_GRPC)"
    )
    parser.add_argument("--max-batch-size", type=int, help="inputs per Triton call (default 32)")
    parser.add_argument(
        "--max-queue-delay-us", type=int, help="longest wait to fill a batch (default 2000)"
    )
    parser.add_argument(
        "--max-queue-size", type=int, help="queued inputs before OVERLOADED (default 1024)"
    )
    parser.add_argument(
        "--max-inflight-batches", type=int, help="batches at Triton at once (default 2)"
    )
    parser.add_argument(
        "--adaptive-delay",
        action="store_const",
        const=True,
        help="size the batch wait from measured batch cost (max: --max-queue-delay-us)",
    )
    parser.add_argument(
        "--cache-size", type=int, help="response cache entries, 0 = off (default 10000)"
    )
    parser.add_argument(
        "--max-concurrent-requests",
        type=int,
        help="predicts at once before 503 + Retry-After (default 256)",
    )
    parser.add_argument(
        "--max-body-bytes", type=int, help="largest body before 413 (default: largest legal batch)"
    )
    # no --token: a command line is visible to every user of the host (ps); use
    # TICKETFLOW_GATEWAY_TOKEN
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING (default INFO)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    run(
        host=args.host,
        port=args.port,
        triton_url=args.triton_url,
        max_batch_size=args.max_batch_size,
        max_queue_delay_us=args.max_queue_delay_us,
        max_queue_size=args.max_queue_size,
        max_inflight_batches=args.max_inflight_batches,
        adaptive_delay=args.adaptive_delay,
        cache_size=args.cache_size,
        max_concurrent_requests=args.max_concurrent_requests,
        max_body_bytes=args.max_body_bytes,
    )


if __name__ == "__main__":
    main()
