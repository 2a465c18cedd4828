"""KWOK (sigs.k8s.io/kwok) beside the local control plane, `up --kwok`: one process plays the
kubelet of every node. It initializes each node (Ready, addresses), holds a Lease per node in
kube-node-lease as a kubelet's heartbeat, and moves each pod bound to a node through KWOK's stock
stages: Running (Ready) a few seconds after it is bound; for a pod a Job owns, Succeeded after
`pod-complete.stage.kwok.x-k8s.io/delay` (a duration, drawn up to `.../jitter-delay`, which defaults
to 5 s: give both for an exact one); a deleted pod removed. Nothing runs: KWOK writes status only.
"""
from __future__ import annotations

import os
import subprocess

import yaml

from .processes import State, start, write

# Stock stages (kustomize/stage/ in the module), in the order their kustomizations list them.
NODE_STAGES = ("node/fast/node-initialize.yaml", "node/heartbeat-with-lease/node-heartbeat-with-lease.yaml")
POD_STAGES = "pod/general"
PARALLELISM = 16  # workers for node stages, pod stages and node Leases each (KWOK's default: 4)
LEASE_SECONDS = 40  # a kubelet's node Lease: renewed every quarter of it
LEASE_RENEWALS_PER_SECOND = 100  # at most, over all nodes: a larger cluster gets longer Leases


def lease_seconds(nodes: int) -> int:
    """A kubelet's 40 s, or longer where renewing every node's every 10 s would outrun this machine
    (10,000 kubelets renew 1,000 Leases a second)."""
    return max(LEASE_SECONDS, -(-4 * nodes // LEASE_RENEWALS_PER_SECOND))


def stages(module: str) -> list[dict]:
    root = os.path.join(module, "kustomize", "stage")
    with open(os.path.join(root, POD_STAGES, "kustomization.yaml"), encoding="utf-8") as handle:
        pods = [os.path.join(POD_STAGES, name) for name in yaml.safe_load(handle)["resources"]]
    out = []
    for path in (*NODE_STAGES, *pods):
        with open(os.path.join(root, path), encoding="utf-8") as handle:
            out.append(yaml.safe_load(handle))
    return out


def start_kwok(state: State, binary: str, admin: str, nodes: int) -> subprocess.Popen:
    """KWOK managing every node, with the stock stages and a node Lease each."""
    config = state.file("kwok", "kwok.yaml")
    write(config, yaml.safe_dump_all([configuration(nodes), *stages(os.path.join(os.path.dirname(binary), "module"))]))
    return start(state, "kwok", [binary, f"--kubeconfig={admin}", f"--config={config}"])


def configuration(nodes: int) -> dict:
    """KWOK's defaults (v1alpha1's SetObjectDefaults_KwokConfiguration: a KwokConfiguration given
    replaces them rather than amending them; without a CIDR a pod gets no IP, and the pod-create
    stage, which selects pods without one, starts it over and over), more workers, and Leases."""
    return {"apiVersion": "config.kwok.x-k8s.io/v1alpha1", "kind": "KwokConfiguration", "options": {
        "cidr": "10.0.0.0/24", "manageAllNodes": True, "enableDebuggingHandlers": True,
        "enableContentionProfiling": False, "enableProfilingHandler": True, "podsOnNodeSyncParallelism": 1,
        "enablePodsOnNodeSyncListPager": True, "enablePodsOnNodeSyncStreamWatch": False,
        "podPlayStageParallelism": PARALLELISM, "nodePlayStageParallelism": PARALLELISM,
        "nodeLeaseParallelism": PARALLELISM, "nodeLeaseDurationSeconds": lease_seconds(nodes)}}
