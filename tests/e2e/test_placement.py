"""What the webhook promises, against the real kube-apiserver, kube-scheduler and
kube-controller-manager (hack/local-cluster): the Job controller's pods pass our webhook, the
scheduler honours our affinity and our gate, the apiserver accepts our patches and the releaser's.
"""
from __future__ import annotations

import json

from conftest import eventually
from e2e.conftest import filler, job, label_of

LEAF, SPINE = "topology.scheduler/leaf", "topology.scheduler/spine"
GATE = "topology.scheduler/placement"


def bound(cluster, namespace, count, selector=""):
    """The namespace's pods (those `selector` selects) once `count` of them are bound, else None."""
    pods = cluster.pods(namespace, selector)
    return pods if len(pods) == count and all(p["spec"].get("nodeName") for p in pods) else None


def leaves_of(cluster, pods):
    return {label_of(cluster, p["spec"]["nodeName"], LEAF) for p in pods}


def test_a_consolidated_job_lands_in_the_leaf_we_decided_with_gpu_ids_and_nccl(cluster):
    with cluster.namespace("consolidated") as ns:
        answer = json.loads(cluster.apply(job("train", 4, annotations={
            "topology.scheduler/placement-strategy": "consolidated"}), namespace=ns).stdout)
        template = answer["spec"]["template"]
        terms = template["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        decided = {v for t in terms["nodeSelectorTerms"] for e in t["matchExpressions"] if e["key"] == LEAF
                   for v in e["values"]}
        assert len(decided) == 1, terms
        pods = eventually(lambda: bound(cluster, ns, 4), timeout=60, what="the Job controller's 4 pods bound")
        assert leaves_of(cluster, pods) == decided
        assert len({p["spec"]["nodeName"] for p in pods}) == 4  # one 8-GPU pod per node
        for pod in pods:
            assert pod["metadata"]["annotations"]["topology.scheduler/gpu-ids"] == "0-7"
            env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
            assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID" and env["NCCL_IB_DISABLE"] == "0"


def test_a_balanced_job_prefers_its_domain_and_spills_when_it_is_full(cluster):
    with cluster.namespace("balanced") as ns:
        cluster.apply(job("fits", 2, annotations={"topology.scheduler/preferred-domain": "leaf-2"}), namespace=ns)
        pods = eventually(lambda: bound(cluster, ns, 2), timeout=60, what="2 pods bound")
        assert leaves_of(cluster, pods) == {"leaf-2"}
        leaf3 = [n["metadata"]["name"] for n in cluster.nodes() if n["metadata"]["labels"][LEAF] == "leaf-3"]
        cluster.apply(*(filler(node) for node in leaf3), namespace=ns)  # leaf-3 taken by someone else
        cluster.apply(job("spills", 2, annotations={"topology.scheduler/preferred-domain": "leaf-3"}), namespace=ns)
        pods = eventually(lambda: bound(cluster, ns, 2, "job-name=spills"), timeout=60, what="the spilled pods bound")
        assert "leaf-3" not in leaves_of(cluster, pods)  # nothing stuck waiting for a full leaf


def test_a_server_side_dry_run_carries_our_mutation_and_holds_nothing(cluster):
    with cluster.namespace("dry-run") as ns:
        manifest = job("dry", 1, annotations={"topology.scheduler/placement-strategy": "consolidated"})
        first = json.loads(cluster.apply(manifest, namespace=ns, dry_run=True).stdout)
        second = json.loads(cluster.apply(manifest, namespace=ns, dry_run=True).stdout)
        for answer in (first, second):
            assert "topology.scheduler/placement" in answer["spec"]["template"]["metadata"]["annotations"]
        hint = [a["spec"]["template"]["metadata"]["annotations"]["topology.scheduler/placement"]
                for a in (first, second)]
        assert hint[0] == hint[1]  # the first dry run held nothing: the second got the same node
        assert cluster.batch.list_namespaced_job(ns).items == []


def test_a_gated_wait_is_released_by_the_apiserver_and_bound_even_after_a_webhook_restart(cluster):
    with cluster.namespace("gated") as ns:
        nodes = [n["metadata"]["name"] for n in cluster.nodes()]
        taken = {node for p in cluster.all_pods() if (node := p["spec"].get("nodeName"))}
        cluster.apply(*(filler(node) for node in nodes if node not in taken), namespace=ns)
        cluster.apply(job("waiter", 2, annotations={"topology.scheduler/placement-strategy": "consolidated"}),
                      namespace=ns)
        def gated():
            """Both pods made, held by our gate, and shown by the scheduler as SchedulingGated."""
            pods = cluster.pods(ns, "job-name=waiter")
            return len(pods) == 2 and all(
                {"name": GATE} in (p["spec"].get("schedulingGates") or []) and not p["spec"].get("nodeName")
                and any(c.get("reason") == "SchedulingGated" for c in (p.get("status") or {}).get("conditions") or ())
                for p in pods)
        eventually(gated, timeout=60, what="both pods gated")
        for replica in ("webhook-0", "webhook-1"):  # restarted while its pods are gated
            result = cluster.local_cluster("restart", replica)
            assert result.returncode == 0, result.stderr
        leaf = "leaf-6"
        freed = [p for p in cluster.pods(ns) if p["metadata"]["name"].startswith("fill-")
                 and label_of(cluster, p["spec"]["nodeName"], LEAF) == leaf][:2]
        for pod in freed:
            cluster.finish(pod)  # their kubelet reports them done
        pods = eventually(lambda: bound(cluster, ns, 2, "job-name=waiter"), timeout=60, what="the released pods bound")
        assert leaves_of(cluster, pods) == {leaf}
        assert {p["spec"]["nodeName"] for p in pods} == {p["spec"]["nodeName"] for p in freed}
        for pod in pods:
            annotations = pod["metadata"]["annotations"]
            assert "topology.scheduler/gated-request" not in annotations and not pod["spec"].get("schedulingGates")


def test_two_replicas_never_send_a_pod_to_a_node_without_room(cluster):
    with cluster.namespace("burst") as ns:
        jobs = [job(f"j{i:02}", 1, gpus=8, annotations={"topology.scheduler/placement-strategy": "consolidated"})
                for i in range(20)]
        cluster.apply(*jobs, namespace=ns)  # one request: the apiserver admits them concurrently
        pods = eventually(lambda: bound(cluster, ns, 20), timeout=90, what="20 pods bound")
        nodes = {n["metadata"]["name"]: int(n["status"]["allocatable"]["nvidia.com/gpu"]) for n in cluster.nodes()}
        used: dict[str, int] = {}
        for pod in cluster.all_pods():
            node = pod["spec"].get("nodeName")
            if node and (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
                used[node] = used.get(node, 0) + sum(
                    int(c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu", 0))
                    for c in pod["spec"]["containers"])
        assert all(used[node] <= nodes[node] for node in used), used
        for pod in pods:  # each went where we told it: the node our pin names
            terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            named = {v for t in terms["nodeSelectorTerms"] for e in t["matchExpressions"]
                     if e["key"] == "kubernetes.io/hostname" for v in e["values"]}
            assert not named or pod["spec"]["nodeName"] in named


SECOND_WEBHOOK = "e2e-second.example.com"


def test_with_the_webhook_stopped_workloads_are_admitted_unmodified_and_run(cluster):
    with cluster.namespace("stopped") as ns:
        for replica in ("webhook-0", "webhook-1"):
            assert cluster.local_cluster("stop", replica).returncode == 0
        try:
            answer = json.loads(cluster.apply(job("plain", 1, annotations={
                "topology.scheduler/placement-strategy": "consolidated"}), namespace=ns).stdout)
            assert "topology.scheduler/placement" not in (answer["spec"]["template"].get("metadata") or {}).get(
                "annotations", {})
            pods = eventually(lambda: bound(cluster, ns, 1), timeout=60, what="the unplaced pod bound by the scheduler alone")
            assert "affinity" not in pods[0]["spec"]
        finally:
            for replica in ("webhook-0", "webhook-1"):
                result = cluster.local_cluster("restart", replica)
                assert result.returncode == 0, result.stderr


def serve_second_webhook(cluster, tmp_path):
    """A mutating webhook of the test's, called after ours (by name), that labels every Job's pod
    template: the apiserver then calls ours again (reinvocationPolicy IfNeeded)."""
    import base64
    import http.server
    import ssl
    import threading

    from webhook.credentials import certs
    pki = cluster.state / "pki"
    cert, key = certs.make_serving_cert((pki / "ca.crt").read_bytes(), (pki / "ca.key").read_bytes(),
                                        ["localhost"], ["127.0.0.1"])
    (tmp_path / "second.crt").write_bytes(cert)
    (tmp_path / "second.key").write_bytes(key)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's naming
            review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            labels = review["request"]["object"]["spec"]["template"].get("metadata", {}).get("labels")
            patch = [{"op": "add", "path": "/spec/template/metadata/labels", "value": {"second": "yes"}}] \
                if not labels or "second" not in labels else []
            response = {"uid": review["request"]["uid"], "allowed": True}
            if patch:
                response.update(patchType="JSONPatch", patch=base64.b64encode(json.dumps(patch).encode()).decode())
            body = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                               "response": response}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / "second.crt", tmp_path / "second.key")
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, base64.b64encode((pki / "ca.crt").read_bytes()).decode()


def test_reinvoked_after_a_second_webhook_our_second_pass_changes_nothing(cluster, tmp_path):
    server, ca_bundle = serve_second_webhook(cluster, tmp_path)
    with cluster.namespace("reinvoked") as ns:
        configuration = {
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": f"zz-e2e-second-{ns}"},
            "webhooks": [{"name": "second.e2e.example.com", "admissionReviewVersions": ["v1"], "sideEffects": "None",
                          "reinvocationPolicy": "IfNeeded", "failurePolicy": "Fail",
                          "clientConfig": {"url": f"https://127.0.0.1:{server.server_address[1]}/",
                                           "caBundle": ca_bundle},
                          "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
                          "rules": [{"operations": ["CREATE"], "apiGroups": ["batch"], "apiVersions": ["v1"],
                                     "resources": ["jobs"]}]}]}
        cluster.kubectl("apply", "-f", "-", stdin=json.dumps(configuration))
        try:
            probe = job("probe", 1)
            eventually(lambda: _labelled(json.loads(cluster.apply(probe, namespace=ns, dry_run=True).stdout)),
                 timeout=30, what="the second webhook registered")
            manifest = job("twice", 2, annotations={"topology.scheduler/placement-strategy": "consolidated"})
            answer = json.loads(cluster.apply(manifest, namespace=ns).stdout)
            template = answer["spec"]["template"]
            assert template["metadata"]["labels"]["second"] == "yes"
            assert "topology.scheduler/placement" in template["metadata"]["annotations"]
            outcomes = [line["outcome"] for line in _admissions(cluster) if line.get("name") == "twice"
                        and line.get("kind") == "Job"]
            assert outcomes == ["placed", "ignored"], outcomes  # reinvoked: our own output is left as it is
        finally:
            cluster.kubectl("delete", "mutatingwebhookconfiguration", f"zz-e2e-second-{ns}")
            server.shutdown()


def _labelled(answer):
    return (answer["spec"]["template"].get("metadata") or {}).get("labels", {}).get("second") == "yes"


def _admissions(cluster):
    lines = []
    for log in sorted((cluster.state / "logs").glob("webhook-*.log")):
        for text in log.read_text().splitlines():
            try:
                line = json.loads(text)
            except ValueError:
                continue
            if line.get("message", "").startswith("admission "):
                lines.append(line)
    return sorted(lines, key=lambda line: line["time"])
