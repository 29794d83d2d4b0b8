"""Issue 14 parts 1 and 4 on the real stack: the ensemble (v1 and v2 at once, scores merged)
and a cascade (v1, then v2 when v1 is unsure), one private worker running both workflows.

A selector in a folder of the test's own sends tickets tagged `metadata.flow: cascade` to the
cascade, the others to the shipped `ticket_classify_ensemble`.
"""

from __future__ import annotations

import uuid
from collections import Counter
from pathlib import Path

import orjson
import pytest
import yaml

from devstack import app_processes
from streams.settings import Settings
from streams.topics import Topics
from tests.integration.kafka_helpers import ROUTES, Collector, publish, tickets

pytestmark = pytest.mark.integration

WORKFLOWS = Path(__file__).resolve().parents[2] / "agents" / "workflows"
N = 40  # half through each workflow
# below this v1 confidence the cascade asks v2: high enough that some of N tickets do
BELOW = 0.97
# a branch's time limit here: v2 on a CPU Triton shared with the whole suite took over the
# shipped 800 ms for 8 of 20 tickets in one CI run
SLOW_MS = 3000


def relaxed(workflow: dict) -> dict:
    """The shipped ensemble with deadlines a loaded two-core machine meets: the test checks
    which branches answered and who decided, not how fast (that is `ticketflow bench`)."""
    steps = []
    for s in workflow["steps"]:
        if s["type"] == "parallel":
            s = {**s, "branches": [{**b, "timeout_ms": SLOW_MS} for b in s["branches"]]}
        steps.append(s)
    return {**workflow, "deadline_ms": 4 * SLOW_MS, "steps": steps}


def write_workflows(folder: Path) -> Path:
    ensemble = relaxed(yaml.safe_load((WORKFLOWS / "ticket_classify_ensemble.yaml").read_text()))
    (folder / "ticket_classify_ensemble.yaml").write_text(yaml.safe_dump(ensemble))
    cascade = {**ensemble, "name": "ticket_classify_cascade_it"}
    cascade["steps"] = [
        {
            "name": "infer_cascade_it",
            "type": "inference_call",
            "model": "ticket_classifier",
            "timeout_ms": SLOW_MS,
            "cascade": {"first": "v1", "then": "v2", "below": BELOW},
            "retry": {"max_attempts": 3, "backoff_ms": 200},
        }
        if s["type"] == "parallel"
        else s
        for s in ensemble["steps"]
    ]
    (folder / "cascade.yaml").write_text(yaml.safe_dump(cascade))
    selector = {
        "default": "ticket_classify_ensemble",
        "rules": [
            {
                "when": [{"field": "metadata.flow", "value": "cascade"}],
                "workflow": "ticket_classify_cascade_it",
            }
        ],
    }
    (folder / "selector.yaml").write_text(yaml.safe_dump(selector))
    return folder / "ticket_classify_ensemble.yaml"


@pytest.fixture
def private(tmp_path, live_stack, gateway):
    env = {
        "TICKETFLOW_TOPIC_PREFIX": f"par{uuid.uuid4().hex[:8]}.",
        "TICKETFLOW_WORKER_WEB_PORT": str(app_processes.free_port()),
        "TICKETFLOW_WORKFLOW_FILE": str(write_workflows(tmp_path)),
    }
    settings = Settings(**{k.removeprefix("TICKETFLOW_").lower(): v for k, v in env.items()})
    topics = Topics(settings.topic_prefix)
    watch = Collector(settings.kafka_bootstrap, [topics.out(r) for r in ROUTES])
    audit = Collector(settings.kafka_bootstrap, [topics.audit])
    worker = app_processes.start_worker(settings, env, f"worker-{settings.topic_prefix}")
    yield settings, topics, watch, audit
    worker.stop()
    watch.close()
    audit.close()


def test_ensemble_and_cascade_tickets_name_their_branches_calls_and_deciding_version(private):
    settings, topics, watch, audit = private
    batch = tickets(N, f"par{uuid.uuid4().hex[:6]}", seed=14)
    for t in batch[: N // 2]:
        t["metadata"] = {"flow": "cascade"}
    # one ticket first: a worker that just started spends a deadline joining its group
    warm = tickets(1, f"warm{uuid.uuid4().hex[:6]}", seed=15)
    publish(settings.kafka_bootstrap, topics.tickets_in, warm)
    assert watch.until(lambda rs: len(rs) >= 1, 90, 0), "the worker answers"
    watch.records.clear()
    publish(settings.kafka_bootstrap, topics.tickets_in, batch)
    records = watch.until(lambda rs: len({m.key() for m in rs}) >= N, 150, 2)
    results = {m.key().decode(): orjson.loads(m.value()) for m in records}
    assert len(results) == N and len(records) == N, "one result per ticket"
    cascade_ids = {t["ticket_id"] for t in batch[: N // 2]}

    versions = Counter()
    for tid, r in results.items():
        steps = [e["step"] for e in r["decision_path"]]
        status = {e["step"]: e["status"] for e in r["decision_path"]}
        if tid in cascade_ids:
            assert r["workflow"] == "ticket_classify_cascade_it"
            # one entry for the step, as for any step; its detail names the deciding version
            [entry] = [e for e in r["decision_path"] if e["step"].startswith("infer_cascade_it")]
            assert entry["step"] == "infer_cascade_it", r["decision_path"]
            if entry["status"] != "ok":  # degraded: past its deadline on a busy machine
                continue
            # v2 ran exactly when v1 was unsure, and then it decided
            asked = entry["detail"] == f"below {BELOW}: v2 decided"
            assert asked or entry["detail"] == "v1 decided", entry
            assert r["model_version"] == ("v2" if asked else "v1"), r["decision_path"]
            versions[f"cascade:{r['model_version']}"] += 1
            continue
        assert r["workflow"] == "ticket_classify_ensemble"
        # one entry per branch, before the group's own, and before rules
        assert steps.index("infer_ensemble.v1") < steps.index("infer_ensemble")
        assert steps.index("infer_ensemble.v2") < steps.index("infer_ensemble")
        answered = [v for v in ("v1", "v2") if status[f"infer_ensemble.{v}"] == "ok"]
        if r["degraded"]:  # past its deadline (advice only), or neither branch answered
            late = r["degraded_reason"].startswith("WORKFLOW_DEADLINE")
            assert late or not answered, (r["degraded_reason"], r["decision_path"])
        assert r["model_version"] == ("+".join(answered) or None)
        versions[f"ensemble:{r['model_version']}"] += 1
    # most ensemble tickets had both answers; the cascade sent some tickets on to v2
    assert versions["ensemble:v1+v2"] >= N // 2 * 0.8, versions
    assert versions["cascade:v2"] >= 1 and versions["cascade:v1"] >= 1, versions

    # the audit has the same entries, one trail per ticket: one per branch and per step
    trails = audit.until(lambda rs: len({m.key() for m in rs}) >= N, 60, 2)
    entries = [e for m in trails for e in orjson.loads(m.value())["steps"]]
    audited = Counter(e["step"] for e in entries)
    assert audited["infer_ensemble.v1"] >= N // 2 and audited["infer_ensemble.v2"] >= N // 2
    assert audited["infer_cascade_it"] >= N // 2 and audited["infer_cascade_it.v1"] == 0
    model_versions = {e["model_version"] for e in entries if e["step"] == "infer_ensemble.v2"}
    assert model_versions <= {"v2", None}, "a branch's audit names the branch's own answer"
