"""Kueue (sigs.k8s.io/kueue) beside the local control plane, `up --kueue`: its CRDs, the controller
as a local process with its admission webhooks registered by URL (as its release installs them, Job
and Pod webhooks included), and one queue over the GPU nodes with Topology-aware scheduling:

- a Topology over the nodes' zone, spine, leaf and hostname labels (the levels bench/policies.py's
  model of Kueue uses);
- a ResourceFlavor of the H100 nodes (`nvidia.com/gpu.product`) on that Topology;
- a ClusterQueue over nvidia.com/gpu, cpu and memory, its quota the nodes' allocatable
  (BestEffortFIFO, or StrictFIFO with --kueue-strict-fifo), open to every namespace;
- a LocalQueue named `gpus` in `default` (`local_queue(ns)` makes one in another namespace).

A Job joins it with the label `kueue.x-k8s.io/queue-name: gpus`; Kueue's webhook suspends it at
creation and Kueue starts it when admitted. The controller runs without leader election, with the
batch/job integration only, without its internal certificate management (the local cluster's CA
signs its webhook's certificate) and without the visibility API server (VisibilityOnDemand=false).
"""
from __future__ import annotations

import glob
import os
import shutil
import subprocess
import urllib.request

import yaml

from webhook.core.resources import quantity

from .processes import Failed, State, create_objects, free_port, kubectl, pointed_here, start, wait_for, write

NAMESPACE = "kueue-system"
QUEUE = "gpus"  # the ClusterQueue, and the LocalQueue a Job names in kueue.x-k8s.io/queue-name
TOPOLOGY = "network"
FLAVOR = "h100"
API = "kueue.x-k8s.io/v1beta2"
LEVELS = ("topology.kubernetes.io/zone", "topology.scheduler/spine", "topology.scheduler/leaf",
          "kubernetes.io/hostname")
GPU_PRODUCT = ("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3")
# Kueue v0.17.0 reads its metrics certificate from this fixed path when its internal certificate
# management is off (cmd/kueue/main.go), and exits without one.
METRICS_CERTS = "/etc/kueue/metrics/certs"
# Without root: Kueue runs in a user and mount namespace of its own where an overlay on /etc adds
# our certificate at METRICS_CERTS; nothing outside the state folder is written.
IN_NAMESPACE = """set -e
mount -t tmpfs tmpfs "$1"
mkdir -p "$1/upper/kueue/metrics/certs" "$1/work"
cp "$2/tls.crt" "$2/tls.key" "$1/upper/kueue/metrics/certs/"
mount -t overlay overlay -o "lowerdir=/etc,upperdir=$1/upper,workdir=$1/work" /etc
shift 2
exec "$@"
"""


def local_queue(namespace: str) -> dict:
    """The LocalQueue `gpus` of `namespace`, feeding the cluster's ClusterQueue."""
    return {"apiVersion": API, "kind": "LocalQueue", "metadata": {"name": QUEUE, "namespace": namespace},
            "spec": {"clusterQueue": QUEUE}}


def queue_objects(nodes: list[dict], strict_fifo: bool) -> list[dict]:
    """The Topology, ResourceFlavor, ClusterQueue and `default`'s LocalQueue over `nodes`."""
    def total(resource: str) -> int:
        return sum(quantity(str(n["status"]["allocatable"].get(resource, "0")), resource) for n in nodes)
    quota = [{"name": "nvidia.com/gpu", "nominalQuota": total("nvidia.com/gpu")},
             {"name": "cpu", "nominalQuota": f"{total('cpu')}m"}, {"name": "memory", "nominalQuota": total("memory")}]
    return [
        {"apiVersion": API, "kind": "Topology", "metadata": {"name": TOPOLOGY},
         "spec": {"levels": [{"nodeLabel": label} for label in LEVELS]}},
        {"apiVersion": API, "kind": "ResourceFlavor", "metadata": {"name": FLAVOR},
         "spec": {"nodeLabels": dict([GPU_PRODUCT]), "topologyName": TOPOLOGY}},
        {"apiVersion": API, "kind": "ClusterQueue", "metadata": {"name": QUEUE},
         "spec": {"namespaceSelector": {}, "queueingStrategy": "StrictFIFO" if strict_fifo else "BestEffortFIFO",
                  "resourceGroups": [{"coveredResources": ["nvidia.com/gpu", "cpu", "memory"],
                                      "flavors": [{"name": FLAVOR, "resources": quota}]}]}},
        local_queue("default")]


def webhook_configurations(module: str, port: int, ca_pem: bytes) -> list[dict]:
    """Kueue's Mutating- and ValidatingWebhookConfiguration as its release has them (named kueue-...,
    with its kustomization's namespace selectors), calling the local process by URL."""
    folder = os.path.join(module, "config", "components", "webhook")
    with open(os.path.join(folder, "manifests.yaml"), encoding="utf-8") as handle:
        configurations = [c for c in yaml.safe_load_all(handle) if c]
    with open(os.path.join(folder, "kustomization.yaml"), encoding="utf-8") as handle:
        patches = [yaml.safe_load(p["patch"]) for p in yaml.safe_load(handle).get("patches") or []]
    for configuration in configurations:
        for patch in patches:
            if patch["metadata"]["name"] == configuration["metadata"]["name"]:
                changes = {w["name"]: w for w in patch["webhooks"]}
                for webhook in configuration["webhooks"]:
                    webhook.update(changes.get(webhook["name"], {}))
        configuration["metadata"]["name"] = f"kueue-{configuration['metadata']['name']}"
    return [pointed_here(c, port, ca_pem) for c in configurations]


def metrics_certs_argv(state: State, certs: str) -> list[str]:
    """What Kueue's command line starts with so that it finds a metrics certificate at
    METRICS_CERTS: nothing where one is there already, else the namespace of IN_NAMESPACE."""
    if all(os.path.exists(os.path.join(METRICS_CERTS, name)) for name in ("tls.crt", "tls.key")):
        return []
    scratch = state.file("kueue", "etc-overlay")
    os.makedirs(scratch, exist_ok=True)
    argv = ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", IN_NAMESPACE, "kueue", scratch, certs]
    if shutil.which("unshare") and subprocess.run([*argv, "true"], capture_output=True).returncode == 0:
        return argv
    raise Failed(f"Kueue v0.17.0 needs a metrics certificate at {METRICS_CERTS}/tls.{{crt,key}} and this machine "
                 f"allows no user namespace to put one there: as root, copy any pair there, e.g. {certs}/tls.*")


def install_kueue(state: State, binary: str, kubectl_binary: str, admin: str, nodes: list[dict],
                  strict_fifo: bool) -> None:
    """CRDs, the controller (ready), its webhooks, then the queue (its ClusterQueue active)."""
    module = os.path.join(os.path.dirname(binary), "module")
    crds = sorted(glob.glob(os.path.join(module, "config", "components", "crd", "bases", "*.yaml")))
    kubectl(kubectl_binary, admin, "apply", "--server-side", *(f"--filename={path}" for path in crds))
    kubectl(kubectl_binary, admin, "wait", "--for=condition=Established", "--timeout=60s",
            *(f"crd/{os.path.basename(p).partition('_')[2].removesuffix('.yaml')}.kueue.x-k8s.io" for p in crds))
    kubectl(kubectl_binary, admin, "create", "namespace", NAMESPACE)
    certs = state.file("kueue", "certs")
    os.makedirs(certs)
    for suffix in ("crt", "key"):
        shutil.copyfile(state.file("pki", f"webhook.{suffix}"), os.path.join(certs, f"tls.{suffix}"))
    health, metrics, webhook = free_port(), free_port(), free_port()
    config = state.file("kueue", "config.yaml")
    write(config, yaml.safe_dump({
        "apiVersion": "config.kueue.x-k8s.io/v1beta2", "kind": "Configuration", "namespace": NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health}"}, "metrics": {"bindAddress": f"127.0.0.1:{metrics}"},
        "webhook": {"host": "127.0.0.1", "port": webhook, "certDir": certs},
        "leaderElection": {"leaderElect": False}, "internalCertManagement": {"enable": False},
        "integrations": {"frameworks": ["batch/job"]}}))
    process = start(state, "kueue", [*metrics_certs_argv(state, certs), binary, f"--config={config}",
                                     f"--kubeconfig={admin}", "--feature-gates=VisibilityOnDemand=false"])
    wait_for("ready Kueue", lambda: _http_ok(f"http://127.0.0.1:{health}/readyz"), process, state, "kueue")
    with open(state.file("pki", "ca.crt"), "rb") as handle:
        create_objects(kubectl_binary, admin, webhook_configurations(module, webhook, handle.read()))
    create_objects(kubectl_binary, admin, queue_objects(nodes, strict_fifo))
    kubectl(kubectl_binary, admin, "wait", "--for=condition=Active", "--timeout=60s", f"clusterqueue/{QUEUE}")


def _http_ok(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=3) as answer:  # noqa: S310 - loopback only
        return answer.status == 200
