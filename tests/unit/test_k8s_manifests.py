"""deploy/k8s, checked offline: every manifest against the Kubernetes schemas
(kubernetes-validate ships them), and each kustomization rendered here in Python, since no
kubectl may be installed: resources, namespace, images, replicas and JSON 6902 patches, the
subset these kustomizations use (a field outside it fails the test instead of being ignored).
Then what the schemas cannot see: every file listed, selectors matching pod labels, probes on
routes the services really serve, scrape annotations on a real port, secrets only by
reference, static member ids from the pod name.
"""

from __future__ import annotations

import copy
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
BASE = K8S / "base"
OVERLAYS = sorted(p.parent for p in (K8S / "overlays").glob("*/kustomization.yaml"))
KUSTOMIZATIONS = [BASE, *OVERLAYS]
K8S_VERSION = "1.30.0"
KNOWN_FIELDS = {"apiVersion", "kind", "namespace", "resources", "images", "replicas", "patches"}
CLUSTER_SCOPED = {"Namespace"}
WORKLOADS = {"Deployment", "StatefulSet"}
# the Secret that deploy/k8s/create-secret.sh makes, and its keys
SECRET_NAME = "ticketflow"
SECRET_KEYS = {
    "kafka_ca",
    "kafka_worker_password",
    "kafka_ingest_password",
    "gateway_token",
    "audit_key",
    "redis_url",
}
SECRET_LIKE = re.compile(r"(PASSWORD|TOKEN|_KEY|REDIS_URL)$")


# ---- a kustomize renderer for the subset used here -------------------------------------------


def _load(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _kustomization(folder: Path) -> dict[str, Any]:
    return yaml.safe_load((folder / "kustomization.yaml").read_text())


def _pointer(path: str) -> list[str]:
    return [p.replace("~1", "/").replace("~0", "~") for p in path.lstrip("/").split("/")]


def _apply_op(doc: dict, op: dict) -> None:
    *parents, last = _pointer(op["path"])
    node: Any = doc
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    if op["op"] == "add":
        if isinstance(node, list):
            node.insert(len(node) if last == "-" else int(last), op["value"])
        else:
            node[last] = op["value"]
    elif op["op"] == "replace":
        key = int(last) if isinstance(node, list) else last
        if key not in (range(len(node)) if isinstance(node, list) else node):
            raise KeyError(op["path"])  # replace needs the target to exist
        node[key] = op["value"]
    elif op["op"] == "remove":
        del node[int(last) if isinstance(node, list) else last]
    else:
        raise ValueError(f"unsupported patch op {op['op']}")


def _patch(docs: list[dict], patch: dict) -> None:
    target = patch["target"]
    hits = [d for d in docs if d["kind"] == target["kind"] and _name(d) == target["name"]]
    assert hits, f"patch target {target} matches no resource"
    for doc in hits:
        for op in yaml.safe_load(patch["patch"]):
            _apply_op(doc, op)


def _set_images(docs: list[dict], images: list[dict]) -> None:
    tags = {i["name"]: f"{i.get('newName', i['name'])}:{i['newTag']}" for i in images}
    for doc in docs:
        for c in _containers(doc, init=True):
            c["image"] = tags.get(c["image"], c["image"])


def render(folder: Path) -> list[dict[str, Any]]:
    k = _kustomization(folder)
    unknown = set(k) - KNOWN_FIELDS
    assert not unknown, f"{folder}: fields this renderer does not know: {unknown}"
    docs: list[dict] = []
    for ref in k.get("resources", []):
        path = folder / ref
        docs += render(path) if path.is_dir() else copy.deepcopy(_load(path))
    for rep in k.get("replicas", []):
        hits = [d for d in docs if d["kind"] in WORKLOADS and _name(d) == rep["name"]]
        assert hits, f"{folder}: replicas for unknown workload {rep['name']}"
        for d in hits:
            d["spec"]["replicas"] = rep["count"]
    for patch in k.get("patches", []):
        _patch(docs, patch)
    _set_images(docs, k.get("images", []))
    if "namespace" in k:
        for d in docs:
            if d["kind"] not in CLUSTER_SCOPED:
                d["metadata"]["namespace"] = k["namespace"]
    return docs


# ---- helpers --------------------------------------------------------------------------------


def _name(doc: dict) -> str:
    return doc["metadata"]["name"]


def _pod_spec(doc: dict) -> dict | None:
    return doc["spec"]["template"]["spec"] if doc["kind"] in WORKLOADS else None


def _containers(doc: dict, init: bool = False) -> list[dict]:
    spec = _pod_spec(doc)
    if spec is None:
        return []
    return spec["containers"] + (spec.get("initContainers", []) if init else [])


def _of_kind(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


def _pod_labels(doc: dict) -> dict[str, str]:
    return doc["spec"]["template"]["metadata"]["labels"]


def _matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def _rendered() -> dict[str, list[dict]]:
    return {str(f.relative_to(K8S)): render(f) for f in KUSTOMIZATIONS}


RENDERED = _rendered()
ALL_RENDERED = [(name, d) for name, docs in RENDERED.items() for d in docs]


# ---- every file, every resource -------------------------------------------------------------


@pytest.mark.parametrize("folder", KUSTOMIZATIONS, ids=lambda f: str(f.relative_to(K8S)))
def test_every_yaml_file_of_a_folder_is_listed_in_its_kustomization(folder: Path) -> None:
    listed = {r for r in _kustomization(folder)["resources"] if (folder / r).is_file()}
    present = {p.name for p in folder.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == present
    for ref in _kustomization(folder)["resources"]:
        assert (folder / ref).exists(), ref


@pytest.mark.parametrize("path", sorted(K8S.rglob("*.yaml")), ids=lambda p: str(p.relative_to(K8S)))
def test_each_manifest_file_is_valid_against_the_kubernetes_schema(path: Path) -> None:
    if path.name == "kustomization.yaml":
        return
    docs = _load(path)
    assert docs
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


@pytest.mark.parametrize(
    ("name", "doc"),
    ALL_RENDERED,
    ids=lambda x: x if isinstance(x, str) else x["kind"] + "/" + _name(x),
)
def test_each_rendered_resource_is_valid_and_in_the_namespace(name: str, doc: dict) -> None:
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    if doc["kind"] not in CLUSTER_SCOPED:
        assert doc["metadata"]["namespace"] == "ticketflow"


def test_the_renderer_fails_on_a_patch_of_a_missing_field() -> None:
    doc = {"kind": "Deployment", "metadata": {"name": "x"}, "spec": {}}
    op = {
        "target": {"kind": "Deployment", "name": "x"},
        "patch": "- {op: replace, path: /spec/replicas, value: 2}",
    }
    with pytest.raises(KeyError):
        _patch([doc], op)
    with pytest.raises(AssertionError):
        _patch([doc], {**op, "target": {"kind": "Deployment", "name": "y"}})


@pytest.mark.parametrize("name", RENDERED)
def test_names_are_unique_and_images_are_tagged(name: str) -> None:
    docs = RENDERED[name]
    keys = [(d["kind"], _name(d)) for d in docs]
    assert len(keys) == len(set(keys))
    for d in docs:
        for c in _containers(d, init=True):
            assert re.fullmatch(r"ticketflow(-triton)?:[\w.]+", c["image"]), c["image"]


# ---- labels, selectors, references ----------------------------------------------------------


@pytest.mark.parametrize("name", RENDERED)
def test_selectors_match_the_pods_they_are_meant_for(name: str) -> None:
    docs = RENDERED[name]
    workloads = [d for d in docs if d["kind"] in WORKLOADS]
    for w in workloads:
        assert _matches(w["spec"]["selector"]["matchLabels"], _pod_labels(w)), _name(w)
    for kind in ("Service", "PodDisruptionBudget"):
        for d in _of_kind(docs, kind):
            sel = d["spec"]["selector"]
            sel = sel.get("matchLabels", sel)
            hits = [w for w in workloads if _matches(sel, _pod_labels(w))]
            # exactly one workload each: a selector too wide would also count another's pods
            assert [_name(w) for w in hits] == [_name(d)], f"{kind} {_name(d)}"


@pytest.mark.parametrize("name", RENDERED)
def test_services_target_named_container_ports(name: str) -> None:
    docs = RENDERED[name]
    for svc in _of_kind(docs, "Service"):
        w = next(w for w in docs if w["kind"] in WORKLOADS and _name(w) == _name(svc))
        ports = {p["name"]: p["containerPort"] for c in _containers(w) for p in c["ports"]}
        for p in svc["spec"]["ports"]:
            assert p["targetPort"] in ports, (_name(svc), p)


@pytest.mark.parametrize("name", RENDERED)
def test_autoscalers_scale_a_deployment_with_a_cpu_request(name: str) -> None:
    docs = RENDERED[name]
    hpas = _of_kind(docs, "HorizontalPodAutoscaler")
    assert {_name(h) for h in hpas} == {"gateway", "ingest"}
    for h in hpas:
        ref = h["spec"]["scaleTargetRef"]
        target = next(d for d in docs if d["kind"] == ref["kind"] and _name(d) == ref["name"])
        assert target["kind"] == "Deployment"
        assert all(c["resources"]["requests"]["cpu"] for c in _containers(target))
        assert 1 <= h["spec"]["minReplicas"] <= h["spec"]["maxReplicas"]


@pytest.mark.parametrize("name", RENDERED)
def test_every_workload_has_a_disruption_budget(name: str) -> None:
    docs = RENDERED[name]
    budgets = {_name(p) for p in _of_kind(docs, "PodDisruptionBudget")}
    assert budgets == {_name(w) for w in docs if w["kind"] in WORKLOADS}


# ---- workers: static member ids ------------------------------------------------------------


@pytest.mark.parametrize("name", RENDERED)
def test_workers_are_a_statefulset_whose_pod_name_is_the_worker_id(name: str) -> None:
    docs = RENDERED[name]
    (sts,) = _of_kind(docs, "StatefulSet")
    assert _name(sts) == "worker"
    env = {e["name"]: e for e in _containers(sts)[0]["env"]}
    assert env["TICKETFLOW_WORKER_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    governing = next(s for s in _of_kind(docs, "Service") if _name(s) == sts["spec"]["serviceName"])
    assert governing["spec"]["clusterIP"] == "None"


def test_a_pod_name_is_a_valid_worker_id() -> None:
    from streams.settings import Settings

    assert Settings(worker_id="worker-23").worker_id == "worker-23"


# ---- probes and scraping: the routes each service really serves -----------------------------


def _routes(source: str, pattern: str) -> set[str]:
    return set(re.findall(pattern, (ROOT / source).read_text()))


def _served() -> dict[str, set[str]]:
    faust_pages = r'@app\.page\("(/[\w/]*)"\)'
    aiohttp = r'add_get\("(/[\w/]*)"'
    return {
        "worker": _routes("agents/worker.py", faust_pages),
        "features": _routes("feature_jobs/job.py", faust_pages),
        "gateway": _routes("inference_gateway/server.py", aiohttp),
        "ingest": _routes("ingest/server.py", aiohttp),
        # Triton's KServe v2 health API
        "triton": {"/v2/health/ready", "/v2/health/live"},
    }


SERVED = _served()
READINESS = {"/ready", "/readyz", "/v2/health/ready"}


def test_the_services_serve_their_health_routes() -> None:
    assert {"/ready", "/metrics"} <= SERVED["worker"] & SERVED["features"]
    assert {"/healthz", "/readyz", "/metrics"} <= SERVED["gateway"] & SERVED["ingest"]


@pytest.mark.parametrize("name", RENDERED)
def test_probes_call_served_routes_on_container_ports(name: str) -> None:
    for w in (d for d in RENDERED[name] if d["kind"] in WORKLOADS):
        for c in _containers(w):
            ports = {p["name"] for p in c["ports"]} | {p["containerPort"] for p in c["ports"]}
            for probe in ("readinessProbe", "livenessProbe"):
                get = c[probe]["httpGet"]
                assert get["path"] in SERVED[_name(w)], (_name(w), probe, get["path"])
                assert get["port"] in ports
            # readiness is the service's own readiness check, not mere liveness
            assert c["readinessProbe"]["httpGet"]["path"] in READINESS
            assert c["readinessProbe"] != c["livenessProbe"]


@pytest.mark.parametrize("name", RENDERED)
def test_every_pod_is_scraped_on_a_port_serving_metrics(name: str) -> None:
    for w in (d for d in RENDERED[name] if d["kind"] in WORKLOADS):
        notes = w["spec"]["template"]["metadata"]["annotations"]
        assert notes["prometheus.io/scrape"] == "true"
        ports = {p["containerPort"] for c in _containers(w) for p in c["ports"]}
        assert int(notes["prometheus.io/port"]) in ports
        assert notes["prometheus.io/path"] == "/metrics"
        assert _name(w) == "triton" or "/metrics" in SERVED[_name(w)]


# ---- secrets and settings -------------------------------------------------------------------


@pytest.mark.parametrize("name", RENDERED)
def test_secrets_come_only_from_the_secret_object(name: str) -> None:
    docs = RENDERED[name]
    assert not _of_kind(docs, "Secret"), "a Secret in the manifests would hold its values"
    for w in (d for d in docs if d["kind"] in WORKLOADS):
        for c in _containers(w, init=True):
            for e in c.get("env", []):
                if SECRET_LIKE.search(e["name"]):
                    ref = e["valueFrom"]["secretKeyRef"]
                    assert ref["name"] == SECRET_NAME and ref["key"] in SECRET_KEYS
        for v in _pod_spec(w).get("volumes", []):
            if "secret" in v:
                assert v["secret"]["secretName"] == SECRET_NAME
                assert {i["key"] for i in v["secret"]["items"]} <= SECRET_KEYS
    for cm in _of_kind(docs, "ConfigMap"):
        assert not any(SECRET_LIKE.search(k) for k in cm["data"]), _name(cm)


def test_the_secret_script_creates_every_key_the_manifests_read() -> None:
    script = (K8S / "create-secret.sh").read_text()
    assert set(re.findall(r"--from-file=(\w+)=", script)) == SECRET_KEYS


def test_ingest_mounts_only_its_own_kafka_password() -> None:
    (ingest,) = [d for d in RENDERED["base"] if d["kind"] == "Deployment" and _name(d) == "ingest"]
    (vol,) = [v for v in _pod_spec(ingest)["volumes"] if "secret" in v]
    assert {i["key"] for i in vol["secret"]["items"]} == {"kafka_ingest_password", "kafka_ca"}


@pytest.mark.parametrize("name", RENDERED)
def test_every_variable_set_is_a_documented_setting(name: str) -> None:
    documented = set(re.findall(r"TICKETFLOW_\w+", (ROOT / "docs" / "settings.md").read_text()))
    names: set[str] = set()
    for d in RENDERED[name]:
        if d["kind"] == "ConfigMap" and _name(d) == "ticketflow-config":
            names |= set(d["data"])
        for c in _containers(d):
            names |= {e["name"] for e in c.get("env", [])}
    unknown = {n for n in names if n.startswith("TICKETFLOW_")} - documented
    assert not unknown


# ---- Triton, overlays -----------------------------------------------------------------------


def _triton(docs: list[dict]) -> dict:
    return next(d for d in docs if d["kind"] == "Deployment" and _name(d) == "triton")


def test_triton_requests_a_gpu_and_gets_the_model_repository_from_an_init_container() -> None:
    triton = _triton(RENDERED["base"])
    (server,) = _containers(triton)
    assert server["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert "--model-repository=/models" in server["args"]
    (init,) = _pod_spec(triton)["initContainers"]
    assert "inference_gateway/model_repository" in " ".join(init["command"])
    mounts = {m["name"] for m in init["volumeMounts"]} & {m["name"] for m in server["volumeMounts"]}
    assert mounts == {"models"}


def test_the_cpu_overlay_drops_the_gpu() -> None:
    (server,) = _containers(_triton(RENDERED["overlays/cpu"]))
    assert "nvidia.com/gpu" not in server["resources"].get("limits", {})


def _replicas(docs: list[dict], name: str) -> int:
    return next(d for d in docs if d["kind"] in WORKLOADS and _name(d) == name)["spec"]["replicas"]


def _setting(docs: list[dict], key: str) -> str:
    return next(d for d in docs if _name(d) == "ticketflow-config")["data"][key]


@pytest.mark.parametrize("overlay", ["overlays/scale-10x", "overlays/scale-100x"])
def test_scale_overlays_leave_partitions_for_every_worker(overlay: str) -> None:
    docs = RENDERED[overlay]
    workers = _replicas(docs, "worker")
    assert workers > _replicas(RENDERED["base"], "worker")
    # partitions cap useful workers; 2-3x the workers leaves room to grow (docs/scaling.md)
    assert int(_setting(docs, "TICKETFLOW_PARTITIONS")) >= 2 * workers


def _fuse_init(docs: list[dict]) -> dict:
    sts = next(d for d in docs if d["kind"] == "StatefulSet")
    return next(c for c in _pod_spec(sts)["initContainers"] if c["name"] == "fuse-workflow")


def test_the_100x_workers_mount_the_fused_workflow_as_the_workflow_file() -> None:
    docs = RENDERED["overlays/scale-100x"]
    init = _fuse_init(docs)
    dst = next(e["value"] for e in init["env"] if e["name"] == "WORKFLOWS_DST")
    sts = next(d for d in docs if d["kind"] == "StatefulSet")
    mount = next(m for m in _containers(sts)[0]["volumeMounts"] if m["name"] == "workflow")
    assert mount["mountPath"] == dst == init["volumeMounts"][0]["mountPath"]
    assert Path(_setting(docs, "TICKETFLOW_WORKFLOW_FILE")) == Path(dst) / "ticket_classify.yaml"


def test_the_100x_init_container_fuses_the_current_default_workflow(tmp_path: Path) -> None:
    """Its script, run on this checkout's definitions: the default fused, the rest as is,
    and `ticketflow config validate` of the selector passes, as in the pod."""
    from agents.definition import load_workflows

    init = _fuse_init(RENDERED["overlays/scale-100x"])
    src = ROOT / "agents" / "workflows"
    env = {
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "WORKFLOWS_SRC": str(src),
        "WORKFLOWS_DST": str(tmp_path),
    }
    done = subprocess.run(init["command"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    fused = yaml.safe_load((tmp_path / "ticket_classify.yaml").read_text())
    default = yaml.safe_load((src / "ticket_classify.yaml").read_text())
    assert fused.pop("fuse") == [["validate", "clean"], ["features", "infer", "rules", "route"]]
    assert fused == default
    workflows = load_workflows(tmp_path / "ticket_classify.yaml")
    assert workflows.default.fuse and len(workflows.definitions) > 1


@pytest.mark.parametrize("name", RENDERED)
def test_faust_services_work_in_their_writable_state_volume(name: str) -> None:
    """Faust makes `<app id>-data` under the state dir (the working directory for anything
    else that writes); the image's /app is read-only to the pods' user."""
    (config,) = [
        d for d in RENDERED[name] if d["kind"] == "ConfigMap" and _name(d) == "ticketflow-config"
    ]
    faust = [d for d in RENDERED[name] if d["kind"] in WORKLOADS]
    faust = [d for d in faust if _name(d) in {"worker", "features"}]
    assert len(faust) == 2
    for w in faust:
        (c,) = _containers(w)
        state = next(m for m in c["volumeMounts"] if m["name"] == "state")
        assert c["workingDir"] == state["mountPath"] == config["data"]["TICKETFLOW_STATE_DIR"]
        volume = next(v for v in _pod_spec(w)["volumes"] if v["name"] == "state")
        assert "emptyDir" in volume
