"""Groups: pods that must be placed together although they reach the webhook one at a time.

Operators that run multi-node training and inference create the pods themselves (Kubeflow's
PyTorchJob and MPIJob, LeaderWorkerSet's groups, KubeRay, JobSet's Jobs when the JobSet itself was
not placed), so every pod of one run arrives as its own Pod. The group they belong to is read from
the pod, never from state: the operators' well-known labels, or our own `topology.scheduler/group`
for anything else. The group's key is a reservation key (namespace/Kind/name), so the hold made
for the group is confirmed pod by pod as its members are bound.

Pods that name a PodGroup (`spec.schedulingGroup.podGroupName`, kube-scheduler's gang scheduling,
Kubernetes 1.36+) are that group; its gang `minCount` sizes it (webhook/objects/workload.py reads
it from the cluster view).

How many pods the group has: `topology.scheduler/group-size`, else what the operator writes on its
pods (LeaderWorkerSet's size annotation), else `topology.scheduler/gpu-count` (the group's total)
divided by the pod's own GPUs. Pure: objects in, values out.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from ..core.model import ANNOTATION_PREFIX, MAPPINGS, quoted
from ..state.holds import reservation_key
from .dra_objects import pod_group_of

# A name: pods with the same group name in a namespace are placed as one group. Default: the
# operators' labels ([operators and queues](docs/operators-and-queues.md)).
GROUP = ANNOTATION_PREFIX + "group"
# Pods in the group, 1 to 100000. Default: the operator's size annotation, else `gpu-count` / the
# pod's GPUs.
GROUP_SIZE = ANNOTATION_PREFIX + "group-size"
GROUP_ANNOTATIONS = (GROUP, GROUP_SIZE)
POD_GROUP = "PodGroup"
POD_GROUP_FIELD = "spec.schedulingGroup.podGroupName"
MAX_GROUP_SIZE = 100_000


@dataclass(frozen=True)
class OperatorLabels:
    """How one operator marks the pods of one group."""

    kind: str  # the operator's object, named in the group key and in messages
    name_label: str  # label whose value names the object
    index_label: str | None = None  # label that numbers one group among the object's groups
    size_annotation: str | None = None  # annotation with the group's pod count, where the operator writes one


OPERATORS = (
    OperatorLabels("LeaderWorkerSet", "leaderworkerset.sigs.k8s.io/name", "leaderworkerset.sigs.k8s.io/group-index",
                   "leaderworkerset.sigs.k8s.io/size"),
    OperatorLabels("JobSet", "jobset.sigs.k8s.io/jobset-name"),
    # PyTorchJob, MPIJob, TFJob...: the kind comes from the pod's controller owner reference
    OperatorLabels("KubeflowJob", "training.kubeflow.org/job-name"),
    OperatorLabels("RayCluster", "ray.io/cluster"),
)


class InvalidGroup(ValueError):
    """A group annotation has a value we do not accept; the message names it and what is allowed."""


@dataclass(frozen=True)
class Membership:
    key: str  # reservation key of the whole group: namespace/Kind/name[/index]
    name: str  # for people: "PyTorchJob ml/bert", "LeaderWorkerSet serve/llm group 1"
    size: int | None  # pods in the group, when the pod says; None: size it from gpu-count
    recognised_by: str  # the label or annotation that made it a group


def membership(obj: Mapping, namespace: str, labels: Mapping, annotations: Mapping) -> Membership | None:
    """The group a pod (or an operator-made object, by its pod template's labels) belongs to.
    Raises InvalidGroup for a bad group or group-size annotation."""
    size = _size(annotations.get(GROUP_SIZE)) if GROUP_SIZE in annotations else None
    named = annotations.get(GROUP)
    if named is not None:
        text = str(named).strip()
        if not re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9._-]{0,251}[A-Za-z0-9])?", text):
            raise InvalidGroup(f"annotation {GROUP}={quoted(named)} is not allowed; allowed: a name of letters, digits, "
                               "'.', '_' and '-' (at most 253 characters)")
        return Membership(reservation_key(namespace, "Group", text), f"group {namespace}/{text}", size, GROUP)
    spec = obj.get("spec")
    pod_group = pod_group_of(spec if isinstance(spec, MAPPINGS) else {})
    if pod_group is not None:
        return Membership(reservation_key(namespace, POD_GROUP, pod_group), f"PodGroup {namespace}/{pod_group}", size,
                          POD_GROUP_FIELD)
    for operator in OPERATORS:
        name = labels.get(operator.name_label)
        if not name:
            continue
        kind = _owner_kind(obj) if operator.kind == "KubeflowJob" else operator.kind
        index = labels.get(operator.index_label) if operator.index_label else None
        if operator.index_label and index is None:
            continue  # an object of the operator that is not one group's pod (a LeaderWorkerSet's StatefulSet)
        suffix = f"/{index}" if index is not None else ""
        if size is None and operator.size_annotation and operator.size_annotation in annotations:
            size = _size(annotations[operator.size_annotation], operator.size_annotation)
        return Membership(reservation_key(namespace, kind, f"{name}{suffix}"),
                          f"{kind} {namespace}/{name}" + (f" group {index}" if index is not None else ""),
                          size, operator.name_label)
    return None


def channel_membership(namespace: str, template: str, annotations: Mapping) -> Membership:
    """Pods that claim one ComputeDomain's IMEX channel (its ResourceClaimTemplate, namespace/name)
    are the ranks of one workload, whoever made them."""
    size = _size(annotations.get(GROUP_SIZE)) if GROUP_SIZE in annotations else None
    name = template.rpartition("/")[2]
    return Membership(reservation_key(namespace, "ComputeDomainChannel", name),
                      f"ComputeDomain channel {namespace}/{name}", size, "spec.resourceClaims")


def claim_membership(namespace: str, claim: str) -> Membership:
    """Pods naming one ResourceClaim not yet allocated (namespace/name) share its devices, so one
    node: the first decides for all, and its GPUs are held once."""
    name = claim.rpartition("/")[2]
    return Membership(reservation_key(namespace, "ResourceClaim", name), f"ResourceClaim {namespace}/{name}", 1,
                      "spec.resourceClaims")


def made_for_group(labels: Mapping) -> bool:
    """An operator's object (a LeaderWorkerSet's StatefulSets) whose pods are placed as group
    members: placing the object itself would book their GPUs a second time."""
    return any(labels.get(operator.name_label) for operator in OPERATORS if operator.index_label)


# Kubeflow's training kinds, whose pods carry training.kubeflow.org/job-name.
KUBEFLOW_KINDS = frozenset({"PyTorchJob", "MPIJob", "TFJob", "XGBoostJob", "PaddleJob", "JAXJob", "MXJob"})


def _owner_kind(obj: Mapping) -> str:
    """The Kubeflow kind of the pod's controller; "KubeflowJob" for any other owner, so a pod that
    names another kind's object (a Job, a Deployment) can never take that object's key."""
    owners = (obj.get("metadata") or {}).get("ownerReferences") or ()
    for owner in owners:
        if isinstance(owner, MAPPINGS) and owner.get("controller") is True and owner.get("kind") in KUBEFLOW_KINDS:
            return str(owner["kind"])
    return "KubeflowJob"


def _size(value: object, key: str = GROUP_SIZE) -> int:
    text = str(value).strip()
    if not re.fullmatch(r"[0-9]{1,6}", text) or not 0 < int(text) <= MAX_GROUP_SIZE:
        raise InvalidGroup(f"annotation {key}={quoted(value)} is not allowed; allowed: a whole number of pods "
                           f"from 1 to {MAX_GROUP_SIZE} in the digits 0-9")
    return int(text)
