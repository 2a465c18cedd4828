"""Every valid configuration is a test case: generated settings (levels lists of any length,
hostname-only, each preset, `auto`) x generated clusters (nodes missing labels, cordoned, NotReady,
tainted, full of pods) x generated workloads (every built-in kind, strategy, max-domain,
preferred-domain, the peers' annotations, groups, suspended Jobs). For each: no admission fails
open; a pin allows no node outside the domain the decision counted, and every node it uses; and a
second pass over our own output changes nothing."""
from __future__ import annotations

import base64
import copy
import json
import os
import pathlib
import uuid

import jsonpatch
from fixtures.builders import workload as make_workload
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.fixtures.shared import allowed_nodes_of
from webhook import admission
from webhook.admission import make_review
from webhook.core.model import Outcome
from webhook.kube import demo
from webhook.objects import templates
from webhook.objects.feed import index_of
from webhook.objects.kinds import kind_of_object
from webhook.objects.manifests import read_objects
from webhook.objects.user_annotations import PEER_PREFERRED, PEER_REQUIRED
from webhook.settings.config import Config
from webhook.settings.loading import levels_from
from webhook.settings.presets import HOSTNAME_LABEL, PRESETS
from webhook.state.index import ClusterIndex

# Label keys levels are drawn from: ours, the presets', and one nobody labels.
LEVEL_KEYS = sorted({lv.label for preset in PRESETS.values() for lv in preset}
                    | {"example.com/rack", "example.com/never-labelled"})
VALUES = ("a", "b", "c")
KINDS = ("Pod", "Job", "Deployment", "StatefulSet", "ReplicaSet", "CronJob", "operator")
# The operators' kinds (JobSet, PyTorchJob, MPIJob, LeaderWorkerSet, RayCluster) as the examples write them.
OPERATOR_OBJECTS = [o for path in sorted((pathlib.Path(__file__).parents[2] / "examples").glob("*.yaml"))
                    for o in read_objects(str(path)) if o["kind"] not in KINDS]


@st.composite
def configurations(draw) -> Config:
    shape = draw(st.sampled_from(["list", "hostname-only", "preset", "auto"]))
    policy = {"pin_when_waiting": draw(st.booleans()), "refuse_unplaceable": draw(st.booleans()),
              "gate_waits": draw(st.booleans()),
              "pin_only_where_locality_pays": draw(st.booleans()), "fill_nics": draw(st.booleans()),
              "protect_waiting_seconds": draw(st.sampled_from([0.0, 1800.0])),
              "communication_share": draw(st.sampled_from([0.0, 0.1, 1.0])),
              "tight_wait_weight": draw(st.sampled_from([0.0, 2.0]))}  # the wait for a tighter domain, off or on
    if shape == "auto":  # the default: the index picks the preset from the nodes' labels
        return Config(**policy)
    if shape == "preset":
        return Config(levels=PRESETS[draw(st.sampled_from(sorted(PRESETS)))], levels_auto=False, **policy)
    if shape == "hostname-only":
        return Config(levels=levels_from([HOSTNAME_LABEL]), levels_auto=False, **policy)
    keys = draw(st.lists(st.sampled_from(LEVEL_KEYS), min_size=1, max_size=5, unique=True))
    if draw(st.booleans()):
        keys.append(HOSTNAME_LABEL)
    return Config(levels=levels_from(keys), levels_auto=False, **policy)


@st.composite
def clusters(draw, config: Config) -> tuple[list[dict], list[dict]]:
    keys = LEVEL_KEYS if config.levels_auto else [lv.label for lv in config.levels]
    nodes, pods = [], []
    for i in range(draw(st.integers(1, 12))):
        name = f"n{i}"
        labels = {key: draw(st.sampled_from(VALUES)) for key in keys if draw(st.integers(0, 9)) < 8}
        gpus = draw(st.sampled_from([0, 1, 2, 4, 8, 8]))
        state = draw(st.sampled_from(["ok"] * 6 + ["cordoned", "not-ready", "tainted"]))
        node = demo.make_node(name, labels, gpus, unschedulable=state == "cordoned", ready=state != "not-ready",
                              taints=[{"key": "dedicated", "value": "x", "effect": "NoSchedule"}]
                              if state == "tainted" else None)
        if draw(st.integers(0, 4)) == 0:
            node["status"]["allocatable"]["pods"] = str(draw(st.integers(0, 2)))
        nodes.append(node)
        used = draw(st.integers(0, gpus))
        if used:
            pods.append(demo.make_pod(f"busy-{name}", name, used, namespace="research"))
    return nodes, pods


@st.composite
def workloads(draw, config: Config, nodes: list[dict]) -> dict:
    kind = draw(st.sampled_from(KINDS))
    annotations: dict[str, str] = {
        "topology.scheduler/placement-strategy": draw(st.sampled_from(["consolidated", "balanced", "distributed"]))}
    levels = [lv for preset in PRESETS.values() for lv in preset] if config.levels_auto else list(config.levels)
    level_names = [lv.name for lv in levels] + [lv.label for lv in levels] + ["node"]
    values = sorted({v for n in nodes for v in n["metadata"]["labels"].values()} | {"nowhere"})
    if draw(st.integers(0, 3)) == 0 and level_names:
        annotations["topology.scheduler/max-domain"] = draw(st.sampled_from(level_names))
    if draw(st.integers(0, 3)) == 0:
        annotations["topology.scheduler/preferred-domain"] = draw(st.sampled_from(values))
    if draw(st.integers(0, 5)) == 0:
        annotations["topology.scheduler/latency-sensitive"] = "true"
    if draw(st.integers(0, 5)) == 0 and levels:
        peer = draw(st.sampled_from(PEER_REQUIRED + PEER_PREFERRED))
        annotations = {peer: draw(st.sampled_from([lv.label for lv in levels]))}
    gpus = draw(st.sampled_from([1, 2, 4, 8]))
    replicas = draw(st.integers(1, 6))
    spec: dict = {}
    template_annotations = None
    if kind == "Pod" and draw(st.integers(0, 3)) == 0:
        annotations["topology.scheduler/group"] = "g"
        annotations["topology.scheduler/group-size"] = str(replicas)
    if kind == "operator":
        obj = copy.deepcopy(draw(st.sampled_from(OPERATOR_OBJECTS)))
        obj["metadata"]["annotations"] = annotations
        return obj
    obj = make_workload(kind, name=draw(st.sampled_from(["w", "v"])), gpus=gpus,
                        replicas=None if kind in ("Pod",) else replicas,
                        annotations=annotations if kind != "Pod" else None,
                        template_annotations=annotations if kind == "Pod" else template_annotations,
                        spec=spec)
    if kind == "Job" and draw(st.integers(0, 4)) == 0:
        obj["spec"]["suspend"] = True
    return obj


def pod_templates(obj: dict) -> list[dict]:
    return [t.template for t in templates.pod_templates(kind_of_object(obj), obj) if t.template is not None]


def nodes_under(index: ClusterIndex, path: tuple) -> set[str]:
    return {name for name, node in index.tree.nodes.items() if node.path[:len(path)] == path}


def wire_patch(response: dict) -> list:
    return json.loads(base64.b64decode(response["patch"])) if response.get("patch") else []


@st.composite
def cases(draw):
    config = draw(configurations())
    nodes, pods = draw(clusters(config))
    return config, nodes, pods, draw(workloads(config, nodes))


@settings(max_examples=int(os.environ.get("PROPERTY_EXAMPLES", 1000)), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_no_configuration_fails_open_pins_stay_inside_the_decision_and_a_second_pass_changes_nothing(case):
    config, nodes, pods, obj = case
    index = index_of(config, nodes, pods)
    labels = {n["metadata"]["name"]: n["metadata"]["labels"] for n in nodes}
    first = admission.review(make_review(obj, uid=str(uuid.uuid4())), index, config)
    assert first.outcome != "failed-open", first.error
    event(f"{first.outcome} {first.decision.code if first.decision else ''}")
    response = first.review["response"]
    if not response["allowed"]:
        return
    mutated = jsonpatch.apply_patch(obj, wire_patch(response))
    decision = first.decision
    if decision is not None and decision.scope is not None and decision.requirements \
            and decision.outcome in (Outcome.PLACED, Outcome.WAIT):
        counted = nodes_under(index, decision.scope.path)
        for before, after in zip(pod_templates(obj), pod_templates(mutated)):
            allowed = allowed_nodes_of(after, labels)
            if allowed != allowed_nodes_of(before, labels):  # we pinned: never wider than the decision
                assert allowed <= counted, (decision.scope, sorted(allowed - counted))
            if decision.outcome is Outcome.PLACED:  # never excluding a node the decision uses
                assert set(decision.nodes) <= allowed, (decision.nodes, sorted(allowed))
    second = admission.review(make_review(mutated, uid=str(uuid.uuid4())), index, config)
    assert second.outcome != "failed-open", second.error
    assert second.review["response"]["allowed"] and wire_patch(second.review["response"]) == [], second.outcome
    if obj["kind"] in CONTROLLERS:  # a pod its controller makes from our template (the repair check)
        for template in pod_templates(mutated):
            pod = controller_pod(obj, template)
            made = admission.review(make_review(pod, uid=str(uuid.uuid4())), index, config)
            assert made.outcome != "failed-open", made.error


CONTROLLERS = ("Job", "Deployment", "StatefulSet", "ReplicaSet")


def controller_pod(owner: dict, template: dict) -> dict:
    meta = copy.deepcopy(template.get("metadata") or {})
    meta.update(name=f"{owner['metadata']['name']}-x1", namespace=owner["metadata"]["namespace"],
                ownerReferences=[{"apiVersion": owner["apiVersion"], "kind": owner["kind"],
                                  "name": owner["metadata"]["name"], "uid": "u-1", "controller": True}])
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": copy.deepcopy(template["spec"])}
