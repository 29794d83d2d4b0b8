"""`ticketflow chaos`: a fault campaign in the manner of Kafka's system tests and Jepsen.

Each round runs its own workers on a fresh topic prefix, publishes valid tickets at a steady
rate (plus a few hostile records) with a stock confluent-kafka producer, and injects a seeded
random schedule of faults: workers SIGKILLed or frozen past their session timeout, the broker
killed or restarted, Triton, Redis and the gateway killed and brought back. Then it stops
publishing, lets the pipeline drain and checks, as a read_committed consumer would see it,
that every valid ticket has exactly one result and every hostile record is dead-lettered.
A JSON report and a PNG go to --out; see docs/chaos.md.

plan        the fault kinds, the seeded schedule of a round, the campaign's options
traffic     the producer of valid tickets and hostile records
watch       the read_committed watcher of results and dead letters; where a lost ticket is
checks      exactly-once counting and the flow of results around each fault (pure)
children    the campaign's gateway and workers, as processes it kills and restarts
report      the records of faults and rounds, the totals, chaos.json
plot        chaos.png
campaign    `Campaign`, which drives the rounds against the stack, and `main`, the command

plan, checks and report are pure and unit-tested; campaign, children, traffic and watch drive
real processes and Kafka clients. This package is not imported by the runtime packages.
"""
