"""Waits held by a scheduling gate (`gate_waits`): what the mutation writes on a wait, and what
`released` writes when the releaser lets it go."""
import dataclasses

import pytest

from tests.fixtures.builders import PIN, USER_TERM, decision, deep, request, template_of, valid, workload
from webhook.core import injection
from webhook.core.config import Config
from webhook.core.model import Outcome, Strategy
from webhook.objects import mutation

GATED = Config(gate_waits=True)
GATE = {"name": injection.GATE}


def waiting(strategy=Strategy.CONSOLIDATED, **change):
    return dataclasses.replace(decision(request(pods=2, strategy=strategy), Outcome.WAIT), **change)


def spec_of(obj):
    return template_of(obj)["spec"]


def annotations(obj):
    return template_of(obj).get("metadata", {}).get("annotations", {})


def test_a_pinned_wait_for_room_is_gated_instead_of_pinned():
    user_gate = {"name": "example.com/quota"}
    obj = workload("Job", spec={"schedulingGates": [user_gate], "affinity": {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [USER_TERM]}]}}}})
    out = valid(mutation.mutate(obj, "Job", waiting(), GATED, "ml/Job/train"))
    spec = spec_of(out)
    assert spec["schedulingGates"] == [user_gate, GATE]
    assert spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"] == [{"matchExpressions": [USER_TERM]}]  # no pin: the releaser writes it
    assert "preferredDuringSchedulingIgnoredDuringExecution" not in spec["affinity"]["nodeAffinity"]
    assert annotations(out)[injection.WAITING_FOR].endswith("topology.scheduler/leaf=leaf-3")  # protection sees it
    assert injection.loads_request(annotations(out)[injection.GATED_REQUEST]) == waiting().request
    assert "held by scheduling gate topology.scheduler/placement" in mutation.warnings(waiting(), GATED)[0]
    assert mutation.mutate(out, "Job", waiting(), GATED, "ml/Job/train") == out  # our own output: no change


@pytest.mark.parametrize("wait, config", [
    pytest.param(waiting(), Config(gate_waits=False), id="gate_waits off: pinned as before"),
    pytest.param(waiting(code="GrowsPool"), GATED, id="a wait for a pool to grow: gates never trigger autoscalers"),
    pytest.param(waiting(code="ExceedsNodes"), GATED, id="a wait for nodes to be added"),
    pytest.param(waiting(request=dataclasses.replace(request(pods=2), may_pin_wait=False)), GATED,
                 id="a Deployment's wait: its template would gate every pod for good"),
    pytest.param(waiting(Strategy.DISTRIBUTED), GATED, id="a wait that only prefers its domain"),
])
def test_other_waits_are_never_gated(wait, config):
    out = valid(mutation.mutate(workload("Job"), "Job", wait, config))
    assert "schedulingGates" not in spec_of(out) and injection.GATED_REQUEST not in annotations(out)


def test_a_placement_after_a_gated_wait_removes_only_our_gate():
    user_gate = {"name": "example.com/quota"}
    gated = mutation.mutate(workload("Job", spec={"schedulingGates": [user_gate]}), "Job", waiting(), GATED)
    placed = valid(mutation.mutate(gated, "Job", decision(request(pods=2)), GATED))
    assert spec_of(placed)["schedulingGates"] == [user_gate]
    assert injection.GATED_REQUEST not in annotations(placed) and injection.WAITING_FOR not in annotations(placed)
    assert mutation.without_injection(gated, "Job") == workload("Job", spec={"schedulingGates": [user_gate]})


def test_a_gate_of_our_name_that_we_did_not_add_is_left_alone():
    obj = workload("Job", spec={"schedulingGates": [dict(GATE)]})
    assert spec_of(mutation.mutate(obj, "Job", decision(request(pods=2)), GATED))["schedulingGates"] == [GATE]


def gated_pod(**spec):
    job = mutation.mutate(workload("Job", spec=deep(spec)), "Job", waiting(), GATED, "ml/Job/train")
    template = template_of(job)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {**deep(template["metadata"]), "name": "train-0",
                                                              "namespace": "ml"}, "spec": deep(template["spec"])}


def test_released_narrows_the_affinity_writes_the_gpus_and_lifts_only_our_gate():
    user_gate = {"name": "example.com/quota"}
    pod = gated_pod(schedulingGates=[user_gate], affinity={"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [USER_TERM]}]}}})
    placed = decision(request(pods=2, strategy=Strategy.BALANCED), nodes=("gpu-1", "gpu-2"))
    out = valid(mutation.released(pod, placed))
    assert out["spec"]["schedulingGates"] == [user_gate]
    assert out["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"] == [{"matchExpressions": [USER_TERM, PIN]}]  # only added to: the API's rule for gated pods
    assert out["spec"]["containers"] == pod["spec"]["containers"]  # fixed at creation
    meta = out["metadata"]["annotations"]
    assert injection.WAITING_FOR not in meta and injection.GATED_REQUEST not in meta
    assert meta[injection.RESERVATION] == "ml/Job/train" and meta[injection.PLACEMENT].startswith("balanced in leaf")
    assert injection.recorded(out).required == ((PIN,),) and not injection.recorded(out).gated
    assert mutation.without_injection(out, "Pod")["spec"]["schedulingGates"] == [user_gate]


def test_a_request_survives_its_annotation_and_a_foreign_one_reads_as_none():
    asked = dataclasses.replace(request(pods=4), max_domain="leaf", node_selector={"pool": "gpu"},
                                required_node_terms=({"matchExpressions": [USER_TERM]},),
                                tolerations=({"key": "gpu", "operator": "Exists"},), resources=(("cpu", 4000),),
                                min_bandwidth_gbps=400.0, latency_sensitive=True)
    assert injection.loads_request(injection.dumps_request(asked)) == asked
    for foreign in ("", "[]", "{}", '{"pods": 2}', "not json", None):
        assert injection.loads_request(foreign) is None


# -- which gated workloads the releaser decides (core/gating.py) -------------------------------

def pod_named(name, **changes):
    pod = gated_pod()
    pod["metadata"]["name"] = name
    pod["metadata"]["annotations"].update(changes)
    return pod


def test_a_gated_workload_is_ready_once_all_its_pods_exist_and_a_replacement_starts_alone():
    from webhook.core.gating import GatedPods
    pods = GatedPods()
    assert pods.note("a/train-1", pod_named("train-1"), now=5.0)
    assert pods.ready({}) == []  # 1 of its 2 pods: its controller is still making them
    assert not pods.note("a/train-1", pod_named("train-1"), now=9.0)  # seen before: keeps its time
    pods.note("a/train-0", pod_named("train-0"), now=7.0)
    (group,) = pods.ready({})
    assert [p.name for p in group.pods] == ["train-0", "train-1"] and group.request.pods == 2
    assert min(p.since for p in group.pods) == 5.0
    pods.forget("a/train-0")
    (alone,) = pods.ready({"ml/Job/train": 1})  # its sibling runs: the replacement is decided alone
    assert alone.request.pods == 1 and [p.name for p in alone.pods] == ["train-1"]


def test_pods_not_held_by_our_gate_or_unreadable_are_not_kept():
    from webhook.core.gating import GatedPods, gated
    pod = gated_pod()
    assert gated(pod) is not None
    lifted = deep(pod)
    lifted["spec"]["schedulingGates"] = [{"name": "example.com/quota"}]
    unreadable = deep(pod)
    unreadable["metadata"]["annotations"][injection.GATED_REQUEST] = "{}"
    pods = GatedPods()
    for key, other in (("a", lifted), ("b", unreadable)):
        assert gated(other) is None and not pods.note(key, other, now=0.0)
    assert len(pods) == 0


def test_groups_are_decided_oldest_first():
    from webhook.core.gating import GatedPods
    pods = GatedPods()
    for key, reservation, now in (("p1", "ml/Job/late", 9.0), ("p2", "ml/Job/early", 1.0)):
        for index in range(2):
            pods.note(f"{key}-{index}", pod_named(f"{key}-{index}", **{injection.RESERVATION: reservation}), now)
    assert [g.reservation for g in pods.ready({})] == ["ml/Job/early", "ml/Job/late"]
