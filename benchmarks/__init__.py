"""The benchmarks, each measured in one run on this machine (`ticketflow bench …`).

pipeline    the whole pipeline: raw relay, naive consumer, ticketflow, quix-streams peer
variants    variants (a) and (b) of the pipeline bench, each run as a process of its own
peer        variant (e): the same workflow in quix-streams, run from `.venv-peer`
ingest      the HTTP ingest service against a bare producer
features    the feature job against redis-benchmark, and the online reader's latency
gateway     the inference gateway's batching against Triton alone
cli         the `ticketflow bench` commands

Nothing in the runtime packages imports this one: a benchmark drives the runtime from
outside, as an operator would.
"""
