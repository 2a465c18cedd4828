"""No hold without the apiserver's word (issue 59 item 1), on the real apiserver with two webhook
replicas sharing claims: an admission the apiserver refuses after us, a review POSTed straight to
a replica's port, and a DELETE review free or hold nothing past the provisional window; a Job the
apiserver stores keeps its hold until the watch sees it deleted."""
from __future__ import annotations

import json
import ssl
import time
import urllib.request

import yaml
from conftest import eventually
from e2e.conftest import filler, job

from webhook.admission import make_review

WINDOW = 10.0  # provisional_hold_seconds, the default the local cluster runs with
POLICY = "deny-named-deny"


def ports(cluster, flag: str) -> list[str]:
    commands = json.loads((cluster.state / "commands.json").read_text())
    return [command["argv"][command["argv"].index(flag) + 1].rpartition(":")[2]
            for name, command in sorted(commands.items()) if name.startswith("webhook-")]


def _https(cluster, port: str, path: str, body: dict | None = None) -> dict:
    context = ssl.create_default_context(cafile=str(cluster.state / "pki" / "ca.crt"))
    token = yaml.safe_load(open(cluster.kubeconfig))["users"][0]["user"]["token"]
    request = urllib.request.Request(f"https://127.0.0.1:{port}{path}", data=json.dumps(body).encode() if body else None,
                                     headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10, context=context) as answer:  # noqa: S310 - loopback only
        return json.load(answer)


def holds(cluster, namespace: str) -> list[list[str]]:
    """Per replica, the keys of the holds its page lists in `namespace`."""
    return [sorted(h["key"] for h in _https(cluster, port, "/topology.json")["holds"]
                   if h["namespace"] == namespace) for port in ports(cluster, "--metrics-bind")]


def forged(cluster, obj: dict, operation: str = "CREATE") -> dict:
    """A review POSTed straight to the first replica's port, as if from the apiserver."""
    review = make_review(obj, operation=operation, uid=f"forged-{time.monotonic_ns()}")
    if operation == "DELETE":
        review["request"].update(object=None, oldObject=review["request"]["object"])
    return _https(cluster, ports(cluster, "--bind")[0], "/mutate", review)["response"]


def applied(cluster, obj: dict, namespace: str):
    return cluster.kubectl("apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump(obj), check=False)


def test_an_admission_the_apiserver_refuses_after_us_leaves_no_hold(cluster):
    policy = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
              "metadata": {"name": POLICY}, "spec": {
                  "failurePolicy": "Fail",
                  "matchConstraints": {"resourceRules": [{"apiGroups": ["batch"], "apiVersions": ["v1"],
                                                          "operations": ["CREATE"], "resources": ["jobs"]}]},
                  "validations": [{"expression": "!object.metadata.name.startsWith('deny-')"}]}}
    binding = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
               "metadata": {"name": POLICY}, "spec": {"policyName": POLICY, "validationActions": ["Deny"]}}
    cluster.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all([policy, binding]))
    try:
        with cluster.namespace("refused") as namespace:
            annotations = {"topology.scheduler/placement-strategy": "consolidated"}
            # the policy is enforced once the apiserver has loaded it; each probe a CREATE (a dry run
            # stores nothing: a probe stored before then would be re-applied as an UPDATE, never refused)
            probe = yaml.safe_dump(job("deny-probe", 1, annotations=annotations))
            eventually(lambda: cluster.kubectl("create", "--dry-run=server", "-n", namespace, "-f", "-", stdin=probe,
                                               check=False).returncode != 0, timeout=30, what="the policy enforced")
            refused = applied(cluster, job("deny-train", 4, annotations=annotations), namespace)
            assert refused.returncode != 0 and POLICY in refused.stderr
            started = time.monotonic()
            assert eventually(lambda: holds(cluster, namespace) == [[], []], timeout=WINDOW + 10,
                              what="no hold for the refused Job on either replica")
            assert time.monotonic() - started < 20
    finally:
        cluster.kubectl("delete", "validatingadmissionpolicybinding", POLICY, "--ignore-not-found")
        cluster.kubectl("delete", "validatingadmissionpolicy", POLICY, "--ignore-not-found")


def test_forged_reviews_hold_only_for_their_window_and_free_nothing(cluster):
    with cluster.namespace("forged") as namespace:
        annotations = {"topology.scheduler/placement-strategy": "consolidated"}
        cluster.apply(job("team-a", 2, annotations=annotations), namespace=namespace)
        key = f"{namespace}/Job/team-a"
        eventually(lambda: holds(cluster, namespace) == [[key], [key]] or all(
            p["spec"].get("nodeName") for p in cluster.pods(namespace)) and len(cluster.pods(namespace)) == 2,
            timeout=30, what="team-a held or bound")
        stored = json.loads(cluster.kubectl("get", "job", "team-a", "-n", namespace, "-o", "json").stdout)
        answer = forged(cluster, stored, "DELETE")
        assert answer["allowed"] and "patch" not in answer
        bound_or_held = holds(cluster, namespace)
        assert all(h in ([key], []) for h in bound_or_held)  # the DELETE review freed nothing it held
        huge = job("squatter", 30, annotations=annotations)  # every node team-a leaves
        huge["metadata"]["namespace"] = namespace
        assert forged(cluster, huge)["auditAnnotations"]["outcome"] == "placed"
        assert any(f"{namespace}/Job/squatter" in h for h in holds(cluster, namespace))
        eventually(lambda: not any(f"{namespace}/Job/squatter" in h for h in holds(cluster, namespace)),
                   timeout=WINDOW + 10, what="the forged CREATE's hold lapsed on both replicas")
        cluster.apply(job("after", 2, annotations=annotations), namespace=namespace)
        eventually(lambda: len([p for p in cluster.pods(namespace, "job-name=after") if p["spec"].get("nodeName")]) == 2,
                   timeout=60, what="a real Job placed and bound after the window")


def test_a_stored_jobs_hold_outlives_the_window_and_goes_when_the_watch_sees_it_deleted(cluster):
    with cluster.namespace("deleted") as namespace:
        annotations = {"topology.scheduler/placement-strategy": "consolidated"}
        # its pods wait behind a gate of the user's: they never bind, so the hold stays until it goes
        cluster.apply(job("held", 4, annotations=annotations, schedulingGates=[{"name": "example.com/later"}]),
                      namespace=namespace)
        key = f"{namespace}/Job/held"
        time.sleep(WINDOW + 2)
        assert holds(cluster, namespace) == [[key], [key]]  # firm on both: the watch saw it stored
        cluster.kubectl("delete", "job", "held", "-n", namespace, "--cascade=orphan")
        eventually(lambda: holds(cluster, namespace) == [[], []], timeout=30, what="the hold gone on both")


def test_a_job_created_again_under_its_name_while_its_pods_are_gated_starts(cluster):
    """Helm's before-hook-creation, `kubectl replace --force` (issue 59 item 3): the old Job's gated
    pods, deleted by the garbage collector, neither join the new Job's group nor shrink it."""
    nodes = [n["metadata"]["name"] for n in cluster.nodes()]
    with cluster.namespace("again") as namespace:
        cluster.apply(*(filler(node) for node in nodes), namespace=namespace)  # no room anywhere
        annotations = {"topology.scheduler/placement-strategy": "consolidated"}
        cluster.apply(job("train", 2, annotations=annotations), namespace=namespace)

        def gated_pods(uid=None):
            pods = [p for p in cluster.pods(namespace, "job-name=train")
                    if {"name": GATE} in (p["spec"].get("schedulingGates") or [])]
            return [p for p in pods if uid is None or p["metadata"]["ownerReferences"][0]["uid"] == uid]
        eventually(lambda: len(gated_pods()) == 2, timeout=60, what="the first Job's pods gated")
        cluster.kubectl("delete", "job", "train", "-n", namespace, "--wait=false")
        cluster.apply(job("train", 2, annotations=annotations), namespace=namespace)
        uid = json.loads(cluster.kubectl("get", "job", "train", "-n", namespace, "-o", "json").stdout)["metadata"]["uid"]
        eventually(lambda: len(gated_pods(uid)) == 2 and len(gated_pods()) == 2, timeout=90,
                   what="the new Job's pods gated, the old ones gone")
        leaf = [n for n in cluster.nodes() if n["metadata"]["labels"]["topology.scheduler/leaf"] == "leaf-1"]
        for node in leaf[:2]:
            cluster.kubectl("delete", "pod", f"fill-{node['metadata']['name']}", "-n", namespace, "--grace-period=0",
                            "--force")
        eventually(lambda: len([p for p in cluster.pods(namespace, "job-name=train") if p["spec"].get("nodeName")]) == 2,
                   timeout=60, what="the new Job started")


GATE = "topology.scheduler/placement"
