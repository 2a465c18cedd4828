"""What the default install lets each party do, on the real apiserver (issues 37, 41 and 59): the
webhook's own token is bounded by the chart's ValidatingAdmissionPolicy (only pods our gate holds,
their node affinity only narrowed), `ungate` lifts only our gate, and the metrics port shows each
reader what they may see, by TokenReview and SubjectAccessReview.
"""
from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import ROOT, eventually
from e2e.conftest import filler, job, read
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config

GATE = "topology.scheduler/placement"


def as_webhook(cluster) -> k8s_client.CoreV1Api:
    """The API as the webhook's ServiceAccount sees it (the chart's RBAC, the policy)."""
    return k8s_client.CoreV1Api(k8s_config.new_client_from_config(str(cluster.state / "webhook.kubeconfig")))


QUEUE_GATE = "kueue.x-k8s.io/admission"
NODE = {"key": "kubernetes.io/hostname", "operator": "In", "values": ["gpu-s1-l1-n1"]}


def pinned(terms: list[dict]) -> dict:
    return {"op": "add", "path": "/spec/affinity", "value": {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}}


def refused_by_the_policy(webhook, name: str, namespace: str, *patches: list[dict]) -> None:
    for operations in patches:
        with pytest.raises(k8s_client.ApiException) as caught:
            webhook.patch_namespaced_pod(name, namespace, operations, _content_type="application/json-patch+json")
        assert caught.value.status in (403, 422), operations
        assert "ValidatingAdmissionPolicy" in str(caught.value.body), caught.value.body


def test_the_webhooks_token_changes_nothing_on_a_pod_behind_someone_elses_gate(cluster):
    """A pod queued behind Kueue's gate, in kube-system: the API lets its node affinity be set (it
    is gated), the policy does not let the webhook do it (issue 59)."""
    name = "e2e-queued"
    cluster.core.create_namespaced_pod("kube-system", {"metadata": {"name": name}, "spec": {
        "schedulingGates": [{"name": QUEUE_GATE}], "containers": [{"name": "c", "image": "busybox"}]}})
    try:
        refused_by_the_policy(as_webhook(cluster), name, "kube-system",
                              [pinned([{"matchExpressions": [NODE]}])],
                              [{"op": "add", "path": "/metadata/annotations", "value": {GATE: "forged"}}])
        # what the policy refuses the webhook, the API allows: an administrator may pin it
        cluster.core.patch_namespaced_pod(name, "kube-system", [pinned([{"matchExpressions": [NODE]}])],
                                          _content_type="application/json-patch+json")
    finally:
        cluster.core.delete_namespaced_pod(name, "kube-system", grace_period_seconds=0)


def test_the_webhooks_token_may_lift_our_gate_narrow_the_affinity_and_write_our_annotations_only(cluster):
    with cluster.namespace("bounded") as ns:
        cluster.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "held", "labels": {"app": "x"}},
                       "spec": {"schedulingGates": [{"name": "example.com/quota"}, {"name": GATE}],
                                "containers": [{"name": "c", "image": "busybox"}]}}, namespace=ns)
        webhook = as_webhook(cluster)
        refused_by_the_policy(
            webhook, "held", ns,
            [{"op": "replace", "path": "/spec/containers/0/image", "value": "evil"}],
            [{"op": "add", "path": "/metadata/labels/x", "value": "y"}],
            [{"op": "add", "path": "/metadata/annotations/other.example.com~1x", "value": "y"}],
            [{"op": "remove", "path": "/metadata/annotations/kubectl.kubernetes.io~1last-applied-configuration"}],
            [{"op": "remove", "path": "/spec/schedulingGates/0"}],  # a gate that is not ours
            [{"op": "add", "path": "/spec/tolerations/-", "value": {"operator": "Exists"}}],
            # the API lets a gated pod's preferred terms change at will: the policy does not
            [{"op": "add", "path": "/spec/affinity", "value": {"nodeAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 100, "preference": {"matchExpressions": [NODE]}}]}}}])
        # what a release writes: our annotations, the pin where there was none, our gate lifted
        webhook.patch_namespaced_pod("held", ns, [
            {"op": "add", "path": "/metadata/annotations/topology.scheduler~1placement", "value": "ours"},
            pinned([{"matchExpressions": [NODE]}]),
            {"op": "remove", "path": "/spec/schedulingGates/1"}], _content_type="application/json-patch+json")
        stored = cluster.core.read_namespaced_pod("held", ns)
        assert stored.metadata.annotations[GATE] == "ours"
        assert stored.spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution \
            .node_selector_terms[0].match_expressions[0].values == NODE["values"]
        assert [g.name for g in stored.spec.scheduling_gates] == ["example.com/quota"]
        assert stored.spec.containers[0].image == "busybox" and stored.metadata.labels == {"app": "x"}
        # our gate gone, the pod is no longer the webhook's to change
        refused_by_the_policy(webhook, "held", ns, [
            {"op": "replace", "path": "/metadata/annotations/topology.scheduler~1placement", "value": "again"}])
        # the policy binds the webhook only: an administrator may still do what the API allows
        cluster.core.patch_namespaced_pod("held", ns, {"metadata": {"labels": {"x": "y"}}})


def test_ungate_lifts_only_our_gate_so_kube_scheduler_places_the_pods(cluster):
    with cluster.namespace("ungate") as ns:
        taken = {node for p in cluster.all_pods() if (node := p["spec"].get("nodeName"))}
        free = [n["metadata"]["name"] for n in cluster.nodes() if n["metadata"]["name"] not in taken]
        cluster.apply(*(filler(node) for node in free), namespace=ns)
        cluster.apply(job("held", 2, annotations={"topology.scheduler/placement-strategy": "consolidated"},
                          schedulingGates=[{"name": "example.com/quota"}]), namespace=ns)

        def gated():
            pods = cluster.pods(ns, "job-name=held")
            return pods if len(pods) == 2 and all({"name": GATE} in p["spec"].get("schedulingGates", [])
                                                  for p in pods) else None
        eventually(gated, timeout=60, what="both pods behind our gate")
        result = subprocess.run([sys.executable, "-m", "webhook", "ungate", "--all", "--kubeconfig",
                                 str(cluster.state / "webhook.kubeconfig")], capture_output=True, text=True,
                                timeout=120, cwd=ROOT)
        assert result.returncode == 0, result.stderr
        assert "2 pod(s) lifted" in result.stderr, result.stderr
        for pod in cluster.pods(ns, "job-name=held"):
            assert pod["spec"]["schedulingGates"] == [{"name": "example.com/quota"}]  # the user's stays
            annotations = pod["metadata"]["annotations"]
            assert not {"topology.scheduler/gated-request", "topology.scheduler/gate-seal",
                        "topology.scheduler/waiting-for"} & set(annotations)


# ----- the metrics port: who sees what (issue 41) -------------------------------------------------

def token_of(cluster, namespace: str, account: str) -> str:
    cluster.core.create_namespaced_service_account(namespace, {"metadata": {"name": account}})
    answer = cluster.core.create_namespaced_service_account_token(account, namespace, {"spec": {}})
    return answer.status.token


def test_each_reader_sees_only_what_they_may(cluster):
    with cluster.namespace("alpha") as alpha, cluster.namespace("beta") as beta:
        for ns, name in ((alpha, "alpha-secret-train"), (beta, "beta-secret-train")):
            cluster.apply(job(name, 1, annotations={"topology.scheduler/placement-strategy": "consolidated"}),
                          namespace=ns)
        tenant = token_of(cluster, alpha, "tenant")
        rbac = k8s_client.RbacAuthorizationV1Api(cluster.api)
        rbac.create_namespaced_role(alpha, {"metadata": {"name": "pods"}, "rules": [
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]})
        rbac.create_namespaced_role_binding(alpha, {"metadata": {"name": "pods"}, "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pods"}, "subjects": [
            {"kind": "ServiceAccount", "name": "tenant", "namespace": alpha}]})
        platform = token_of(cluster, beta, "platform")
        binding = f"e2e-platform-{beta}"
        rbac.create_cluster_role_binding({"metadata": {"name": binding}, "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "topology-webhook-topology-reader"},
            "subjects": [{"kind": "ServiceAccount", "name": "platform", "namespace": beta}]})
        try:
            assert read(cluster, "/topology.json", None)[0] == {401}
            assert read(cluster, "/topology.json", "not-a-token")[0] == {401}
            assert read(cluster, "/metrics", tenant)[0] == {403}
            assert read(cluster, "/healthz", None)[0] == {200}  # kubelet's probes carry no token

            def shown(token, name):
                statuses, text = read(cluster, "/topology.json", token)
                return (statuses, text) if name in text else None
            statuses, page = eventually(lambda: shown(tenant, "alpha-secret-train"), timeout=30,
                                        what="the tenant's own workload on the page")
            assert statuses == {200} and "beta-secret-train" not in page
            statuses, html = read(cluster, "/topology", tenant)
            assert statuses == {200} and "beta-secret-train" not in html
            statuses, everything = eventually(lambda: shown(platform, "beta-secret-train"), timeout=30,
                                              what="every namespace's workloads for the platform team")
            assert statuses == {200} and "alpha-secret-train" in everything
        finally:
            rbac.delete_cluster_role_binding(binding)
