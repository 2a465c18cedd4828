"""GPUs through Dynamic Resource Allocation, against the real kube-apiserver, kube-scheduler and
kube-controller-manager (hack/local-cluster --dra): nodes without nvidia.com/gpu in allocatable, a
DeviceClass mapping the extended resource onto the ResourceSlices' devices (docs/dra.md).

What only the real components show: the scheduler turns a pod's `nvidia.com/gpu` into a
ResourceClaim of its own and allocates it on the nodes we pinned; our live view counts that claim
once (not once for the pod and once more for its claim); a ResourceClaimTemplate we align keeps the
constraint we write through the apiserver's validation, and the real structured allocator then
picks devices that satisfy it where, left alone, it picks devices that do not.
"""
from __future__ import annotations

import json
import pathlib
import ssl
import urllib.request

import pytest
import yaml
from conftest import eventually
from e2e.conftest import job, label_of
from kubernetes import client as k8s_client
from prometheus_client.parser import text_string_to_metric_families

LEAF = "topology.scheduler/leaf"
GPU_DRIVER = "gpu.nvidia.com"
EXTENDED_CLAIM = "resource.kubernetes.io/extended-resource-claim"
PCIE_ROOT = "resource.kubernetes.io/pcieRoot"
NUMA_NODE = "resource.kubernetes.io/numaNode"
ALIGN = "topology.scheduler/align"
NIC_DRIVER = "nic.e2e.topology.scheduler"
NIC_LABEL = {"e2e.topology.scheduler/devices": "nics"}
# Each node's NICs, in the order the allocator meets them: the first is on the PCIe root of the
# node's last GPUs (gpu-6, gpu-7: pci0000:03) and alone on its NUMA node, so the allocator's first
# choice without a constraint (gpu-0 with nic-0, nic-0 with nic-1) is misaligned both ways.
NIC_LAYOUT = (("pci0000:03", 1), ("pci0000:00", 0), ("pci0000:01", 0))


# ----- reading the cluster -----------------------------------------------------------------------

def bound(cluster, namespace: str, count: int, selector: str = "") -> list[dict] | None:
    pods = cluster.pods(namespace, selector)
    return pods if len(pods) == count and all(p["spec"].get("nodeName") for p in pods) else None


def claims(cluster, namespace: str | None = None) -> list[dict]:
    objects = k8s_client.CustomObjectsApi(cluster.api)
    if namespace:
        return objects.list_namespaced_custom_object("resource.k8s.io", "v1", namespace, "resourceclaims")["items"]
    return objects.list_cluster_custom_object("resource.k8s.io", "v1", "resourceclaims")["items"]


def allocated_gpus(claim: dict) -> set[tuple[str, str]]:
    """(pool, device) of every GPU the claim holds."""
    results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or ()
    return {(r["pool"], r["device"]) for r in results if r["driver"] == GPU_DRIVER and not r.get("adminAccess")}


def device_attributes(cluster) -> dict[tuple[str, str, str], dict]:
    """(driver, pool, device) -> the device's attributes, from every ResourceSlice."""
    slices = k8s_client.CustomObjectsApi(cluster.api).list_cluster_custom_object(
        "resource.k8s.io", "v1", "resourceslices")["items"]
    return {(s["spec"]["driver"], s["spec"]["pool"]["name"], d["name"]): d.get("attributes") or {}
            for s in slices for d in s["spec"].get("devices") or ()}


def scrape(cluster) -> dict[tuple[str, tuple], float]:
    """The webhook's own /metrics, read as a Prometheus scrape would (HTTPS with a bearer token
    when the port is secure, as it is by default against a cluster)."""
    argv = json.loads((cluster.state / "commands.json").read_text())["webhook-0"]["argv"]
    port = argv[argv.index("--metrics-bind") + 1].rpartition(":")[2]
    if "--no-metrics-secure" in argv:
        request, context = urllib.request.Request(f"http://127.0.0.1:{port}/metrics"), None
    else:
        token = yaml.safe_load(pathlib.Path(cluster.kubeconfig).read_text())["users"][0]["user"]["token"]
        request = urllib.request.Request(f"https://127.0.0.1:{port}/metrics",
                                         headers={"Authorization": f"Bearer {token}"})
        context = ssl.create_default_context(cafile=str(cluster.state / "pki" / "ca.crt"))
    with urllib.request.urlopen(request, timeout=10, context=context) as answer:  # noqa: S310 - loopback
        text = answer.read().decode()
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def gauge(samples: dict, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


# ----- (e) the extended resource: placed by us, allocated by the scheduler, counted once --------

def test_an_extended_resource_job_is_placed_by_us_allocated_on_our_nodes_and_counted_once(dra_cluster):
    cluster = dra_cluster
    assert all("nvidia.com/gpu" not in n["status"]["allocatable"] for n in cluster.nodes())  # DRA nodes only
    with cluster.namespace("dra-extended") as ns:
        answer = json.loads(cluster.apply(job("train", 2, annotations={
            "topology.scheduler/placement-strategy": "consolidated"}), namespace=ns).stdout)
        template = answer["spec"]["template"]
        assert "topology.scheduler/placement" in template["metadata"]["annotations"]
        terms = template["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        decided = {v for t in terms["nodeSelectorTerms"] for e in t["matchExpressions"] if e["key"] == LEAF
                   for v in e["values"]}
        assert len(decided) == 1, terms

        def claimed() -> list[dict] | None:  # bound, with the claim the scheduler made recorded
            pods = bound(cluster, ns, 2)
            return pods if pods and all((p.get("status") or {}).get("extendedResourceClaimStatus") for p in pods) \
                else None
        pods = eventually(claimed, timeout=60, what="2 pods bound with their extended-resource claims")
        assert {label_of(cluster, p["spec"]["nodeName"], LEAF) for p in pods} == decided
        assert len({p["spec"]["nodeName"] for p in pods}) == 2
        by_name = {c["metadata"]["name"]: c for c in claims(cluster, ns)}
        ours: set[tuple[str, str]] = set()
        for pod in pods:
            status = pod["status"]["extendedResourceClaimStatus"]
            assert [m["resourceName"] for m in status["requestMappings"]] == ["nvidia.com/gpu"]
            claim = by_name[status["resourceClaimName"]]
            assert claim["metadata"]["annotations"][EXTENDED_CLAIM] == "true"
            owner = next(o for o in claim["metadata"]["ownerReferences"] if o.get("controller"))
            assert (owner["kind"], owner["uid"]) == ("Pod", pod["metadata"]["uid"])
            node = pod["spec"]["nodeName"]
            selector = claim["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"]
            assert selector == [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]
            gpus = allocated_gpus(claim)
            assert len(gpus) == 8 and {pool for pool, _ in gpus} == {node}  # the demo's pools are named by node
            ours |= gpus
        assert len(ours) == 16

        # Our live view against the truth (every GPU allocated in any claim, once): the pods'
        # nvidia.com/gpu is counted through their claims only, and their hold is confirmed, not
        # added on top. Counted twice, `used` would be 16 above the truth and the leaf full.
        (leaf,) = decided
        leaf_nodes = {n["metadata"]["name"] for n in cluster.nodes() if n["metadata"]["labels"][LEAF] == leaf}

        def agreed() -> tuple[dict, set] | None:
            truth = set().union(*(allocated_gpus(c) for c in claims(cluster)))
            samples = scrape(cluster)
            return (samples, truth) if gauge(samples, "topology_cluster_gpus", state="used") == len(truth) \
                and gauge(samples, "topology_domain_utilization_ratio", level="leaf", domain=leaf) == pytest.approx(
                    len({g for g in truth if g[0] in leaf_nodes}) / (8 * len(leaf_nodes)), abs=1e-5) else None
        samples, truth = eventually(agreed, timeout=30,
                                    what="the webhook's GPU gauges to agree with the allocated claims")
        assert ours <= truth
        assert gauge(samples, "topology_cluster_gpus", state="total") == 8 * len(cluster.nodes())


# ----- the align annotation: our constraint, enforced by the real allocator ---------------------

@pytest.fixture(scope="module")
def nics(dra_cluster):
    """A second driver's devices on every node (NICs with a PCIe root and a NUMA node) and their
    DeviceClass; cluster-scoped, so removed again after this module."""
    nodes = [n["metadata"]["name"] for n in dra_cluster.nodes()]
    objects = [{"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                "metadata": {"name": NIC_DRIVER, "labels": NIC_LABEL},
                "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{NIC_DRIVER}'"}}]}}]
    objects += [{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                 "metadata": {"name": f"{node}-nics", "labels": NIC_LABEL},
                 "spec": {"driver": NIC_DRIVER, "nodeName": node,
                          "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                          "devices": [{"name": f"nic-{i}", "attributes": {
                              "type": {"string": "nic"}, PCIE_ROOT: {"string": root}, NUMA_NODE: {"int": numa}}}
                              for i, (root, numa) in enumerate(NIC_LAYOUT)]}} for node in nodes]
    dra_cluster.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(objects))
    yield NIC_DRIVER
    selector = ",".join(f"{k}={v}" for k, v in NIC_LABEL.items())
    dra_cluster.kubectl("delete", "resourceslices,deviceclasses", "-l", selector, "--wait=false")


def template(name: str, requests: list[dict], align: str | None = None) -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "annotations": {ALIGN: align} if align else {}},
            "spec": {"spec": {"devices": {"requests": requests}}}}


def claiming_pod(name: str, template_name: str, annotations: dict | None = None) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "annotations": annotations or {}},
            "spec": {"restartPolicy": "Never", "resourceClaims": [{"name": "devices",
                                                                   "resourceClaimTemplateName": template_name}],
                     "containers": [{"name": "c", "image": "busybox", "resources": {"claims": [{"name": "devices"}]}}]}}


def allocation_of(cluster, namespace: str, pod_name: str) -> list[dict] | None:
    """The attributes of each device allocated for the pod's claim, once the pod is bound."""
    pod = next((p for p in cluster.pods(namespace) if p["metadata"]["name"] == pod_name), None)
    statuses = ((pod or {}).get("status") or {}).get("resourceClaimStatuses") or ()
    if not (pod and pod["spec"].get("nodeName") and statuses):
        return None
    claim = next((c for c in claims(cluster, namespace) if c["metadata"]["name"] == statuses[0]["resourceClaimName"]),
                 None)
    results = (((claim or {}).get("status") or {}).get("allocation") or {}).get("devices", {}).get("results")
    if not results:
        return None
    attributes = device_attributes(cluster)
    return [attributes[(r["driver"], r["pool"], r["device"])] for r in results]


def values_of(devices: list[dict], attribute: str) -> list:
    return [next(iter(d[attribute].values())) if attribute in d else None for d in devices]


def test_an_aligned_template_gets_our_constraint_and_the_allocator_keeps_gpu_and_nic_on_one_root(dra_cluster, nics):
    cluster = dra_cluster
    gpu_and_nic = [{"name": "gpu", "exactly": {"deviceClassName": GPU_DRIVER}},
                   {"name": "nic", "exactly": {"deviceClassName": nics}}]
    with cluster.namespace("dra-align") as ns:
        created = json.loads(cluster.apply(template("gpu-nic", gpu_and_nic, align="pcie"),
                                           template("plain", gpu_and_nic), namespace=ns).stdout)["items"]
        stored = {t["metadata"]["name"]: t["spec"]["spec"]["devices"] for t in created}
        assert stored["gpu-nic"]["constraints"] == [{"requests": ["gpu", "nic"], "matchAttribute": PCIE_ROOT}]
        assert "constraints" not in stored["plain"]  # never on a template that does not ask
        cluster.apply(claiming_pod("aligned", "gpu-nic", {"topology.scheduler/placement-strategy": "consolidated"}),
                      claiming_pod("plain", "plain"), namespace=ns)
        aligned = eventually(lambda: allocation_of(cluster, ns, "aligned"), timeout=60,
                             what="the aligned pod's claim allocated")
        plain = eventually(lambda: allocation_of(cluster, ns, "plain"), timeout=60,
                           what="the plain pod's claim allocated")
        assert sorted(values_of(aligned, "type")) == ["gpu", "nic"]
        roots = values_of(aligned, PCIE_ROOT)
        assert len(set(roots)) == 1 and None not in roots, roots
        # The same request left alone: the allocator takes the first devices that fit, on two roots
        # here, so the shared root above is our constraint's doing.
        assert len(set(values_of(plain, PCIE_ROOT))) == 2, values_of(plain, PCIE_ROOT)
        pod = next(p for p in cluster.pods(ns) if p["metadata"]["name"] == "aligned")
        assert "topology.scheduler/placement" in pod["metadata"]["annotations"]  # placed by us, 1 GPU


def test_a_numa_aligned_template_gets_every_device_on_one_numa_node(dra_cluster, nics):
    cluster = dra_cluster
    with cluster.namespace("dra-numa") as ns:
        created = json.loads(cluster.apply(template("two-nics", [{"name": "nics", "exactly": {
            "deviceClassName": nics, "count": 2}}], align="numa"), namespace=ns).stdout)
        assert created["spec"]["spec"]["devices"]["constraints"] == [{"matchAttribute": NUMA_NODE}]
        cluster.apply(claiming_pod("numa", "two-nics"), namespace=ns)
        devices = eventually(lambda: allocation_of(cluster, ns, "numa"), timeout=60,
                             what="the NUMA-aligned claim allocated")
        assert len(devices) == 2
        assert len(set(values_of(devices, NUMA_NODE))) == 1, devices
