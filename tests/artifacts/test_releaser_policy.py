"""The chart's ValidatingAdmissionPolicy on the webhook's own pod updates (issue 59), its CEL
evaluated by cel-python with the variables the apiserver binds: what the releaser and `ungate`
write passes, and the webhook's token changes nothing on a pod our gate does not hold, and the
node affinity only by narrowing. tests/e2e/test_security.py checks the same on the real apiserver."""
from __future__ import annotations

import copy

import celpy
import pytest

from test_chart import FULLNAME, NAMESPACE, one
from tests.fixtures.builders import PIN, USER_TERM, decision, request, template_of, workload
from webhook.objects.kinds import BY_KEY
from webhook.core import injection
from webhook.core.model import Outcome, Strategy
from webhook.objects import mutation
from webhook.placement import enforce
from webhook.settings.config import Config

WEBHOOK = f"system:serviceaccount:{NAMESPACE}:{FULLNAME}"
OUR_GATE, QUEUE_GATE = {"name": injection.GATE}, {"name": "kueue.x-k8s.io/admission"}
GATED = Config(gate_waits=True)


def evaluate(expression: str, bindings: dict) -> object:
    environment = celpy.Environment()
    return environment.program(environment.compile(expression)).evaluate(bindings)


def refusals(old: dict, new: dict, user: str = WEBHOOK) -> list[str]:
    """The messages of the validations an UPDATE from `old` to `new` by `user` fails; [] admits it."""
    spec = one("defaults", "ValidatingAdmissionPolicy")["spec"]
    bindings = {"object": celpy.json_to_cel(new), "oldObject": celpy.json_to_cel(old),
                "request": celpy.json_to_cel({"userInfo": {"username": user}})}
    if not all(evaluate(c["expression"], bindings) for c in spec["matchConditions"]):
        return []
    variables: dict = {}
    for variable in spec["variables"]:  # each may read those before it
        variables[variable["name"]] = evaluate(variable["expression"], {**bindings, "variables": celpy.celtypes.MapType(
            {celpy.celtypes.StringType(k): v for k, v in variables.items()})})
        bindings["variables"] = celpy.celtypes.MapType({celpy.celtypes.StringType(k): v for k, v in variables.items()})
    return [v["message"] for v in spec["validations"] if not evaluate(v["expression"], bindings)]


def gated_pod(gates: list[dict], required_terms: list[dict] | None = None) -> dict:
    """A pod of a Job whose wait our gate holds, as the Job controller makes it, behind `gates` too."""
    spec: dict = {"schedulingGates": [g for g in gates if g != OUR_GATE]}
    if required_terms is not None:
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": required_terms}}}
    wait = enforce.enforced(decision(request(pods=2), Outcome.WAIT), GATED)
    template = template_of(mutation.mutate(workload("Job", spec=spec), BY_KEY["Job"], wait, GATED, "ml/Job/train"))
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {**copy.deepcopy(template["metadata"]), "name": "train-0",
                                                           "namespace": "ml"}, "spec": copy.deepcopy(template["spec"])}
    if OUR_GATE not in gates:  # behind someone else's gate only
        pod["spec"]["schedulingGates"] = [g for g in pod["spec"]["schedulingGates"] if g != OUR_GATE]
    return pod


def queued_pod() -> dict:
    """A pod behind Kueue's gate alone, in kube-system: never ours."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "queued", "namespace": "kube-system"},
            "spec": {"schedulingGates": [QUEUE_GATE], "containers": [{"name": "c", "image": "busybox"}]}}


def required(pod: dict) -> list[dict]:
    return pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"]


PLACED = decision(request(pods=2, strategy=Strategy.BALANCED), nodes=("gpu-1", "gpu-2"))


@pytest.mark.parametrize("gates, terms", [
    pytest.param([OUR_GATE], None, id="no affinity of its own: the pin set where there was none"),
    pytest.param([QUEUE_GATE, OUR_GATE], [{"matchExpressions": [USER_TERM]}], id="behind a queue's gate too"),
    pytest.param([OUR_GATE], [{}, {"matchExpressions": [USER_TERM]}], id="an empty term stays empty"),
    pytest.param([OUR_GATE], [{"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["bad"]}]}],
                 id="a term of fields gains expressions"),
])
def test_every_release_and_ungate_the_webhook_writes_passes(gates, terms):
    pod = gated_pod(gates, terms)
    released = mutation.released(pod, PLACED, GATED.seal_key)
    assert PIN in required(released)[-1]["matchExpressions"]  # the release pins: the rules below see it
    assert refusals(pod, released) == []
    assert refusals(pod, mutation.ungated(pod)) == []


def with_required(pod: dict, terms: list[dict]) -> dict:
    changed = copy.deepcopy(pod)
    changed["spec"].setdefault("affinity", {})["nodeAffinity"] = {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}
    return changed


ONLY = "the topology webhook may change only pods its own scheduling gate (topology.scheduler/placement) holds"
NARROW = "the topology webhook may only narrow a pod's required node affinity"
PREFERRED = "the topology webhook may not change a pod's preferred node affinity"
NODE = {"key": "kubernetes.io/hostname", "operator": "In", "values": ["gpu-1"]}


def test_a_pod_behind_someone_elses_gate_is_not_the_webhooks_to_change():
    queued = queued_pod()
    assert ONLY in refusals(queued, with_required(queued, [{"matchExpressions": [NODE]}]))  # the API itself allows it
    annotated = copy.deepcopy(queued)
    annotated["metadata"]["annotations"] = {injection.PLACEMENT: "forged"}
    assert refusals(queued, annotated) == [ONLY]
    ours_once = gated_pod([QUEUE_GATE])  # our record, but our gate already lifted
    assert ONLY in refusals(ours_once, with_required(ours_once, [{"matchExpressions": [NODE]}]))
    # the policy binds the webhook only: an administrator may do what the API allows
    assert refusals(queued, with_required(queued, [{"matchExpressions": [NODE]}]), user="kubernetes-admin") == []


@pytest.mark.parametrize("before, after, admitted", [
    pytest.param([{"matchExpressions": [USER_TERM]}], [{"matchExpressions": [USER_TERM, NODE]}], True,
                 id="an expression added"),
    pytest.param([{"matchExpressions": [USER_TERM]}], [{"matchExpressions": [NODE]}], False,
                 id="an expression replaced"),
    pytest.param([{"matchExpressions": [USER_TERM]}], [{"matchExpressions": [USER_TERM]}, {"matchExpressions": [NODE]}],
                 False, id="a term added: terms are ORed"),
    pytest.param([{"matchExpressions": [USER_TERM]}, {"matchExpressions": [NODE]}], [{"matchExpressions": [NODE]}],
                 True, id="a term dropped"),
    pytest.param([{}], [{"matchExpressions": [NODE]}], False, id="an empty term, which matches no node, filled"),
    pytest.param([{"matchExpressions": [USER_TERM]}], None, False, id="the required affinity removed"),
])
def test_the_required_node_affinity_may_only_narrow(before, after, admitted):
    pod = gated_pod([OUR_GATE], before)
    changed = with_required(pod, after) if after is not None else copy.deepcopy(pod)
    if after is None:
        del changed["spec"]["affinity"]["nodeAffinity"]
    assert refusals(pod, changed) == ([] if admitted else [NARROW])


def test_preferred_node_affinity_may_not_change_though_the_api_allows_it_on_gated_pods():
    pod = gated_pod([OUR_GATE])
    steered = copy.deepcopy(pod)
    steered["spec"].setdefault("affinity", {})["nodeAffinity"] = {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 100, "preference": {"matchExpressions": [NODE]}}]}
    assert refusals(pod, steered) == [PREFERRED]
