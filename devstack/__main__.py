"""`python -m devstack up|down|status [PART ...]` (the CLI's `ticketflow stack` twin)."""

from __future__ import annotations

import argparse
import logging
import sys
import time

from streams.settings import Settings

from . import PARTS, SECURE_PARTS, StackError, down, format_status, status, up


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devstack")
    parser.add_argument("action", choices=("up", "down", "status", "fetch"))
    parser.add_argument("parts", nargs="*", metavar="PART", help=f"any of {', '.join(PARTS)}")
    parser.add_argument("--timeout", type=float, default=None, help="seconds per part")
    parser.add_argument("--secure", action="store_true", help="the SASL_SSL broker instead")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    settings = Settings()
    parts = args.parts or (list(SECURE_PARTS) if args.secure else None)
    started = time.monotonic()
    try:
        if args.action == "fetch":  # set-up: Kafka's jars only, nothing started
            from .kafka import ensure_libs

            print(f"kafka jars in {ensure_libs(settings)}", file=sys.stderr)
            return 0
        if args.action == "up":
            up(settings, parts, timeout_s=args.timeout)
        elif args.action == "down":
            # --secure: the secured parts alone; the plain Redis and Triton serve both
            which = args.parts or (["kafka-secure", "redis-secure"] if args.secure else None)
            stopped = down(settings, which, timeout_s=args.timeout)
            print(f"stopped: {', '.join(stopped) or 'nothing'}", file=sys.stderr)
    except StackError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.action != "down":
        print(format_status(status(settings, secure=args.secure)))
    if args.action == "up":
        print(f"up took {time.monotonic() - started:.1f}s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
