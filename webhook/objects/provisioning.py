"""ProvisioningRequests for groups that wait for nodes: which decisions get one, and its objects.

With `provisioning_request_class` set, a workload of several pods that waits (the nodes there are
have no room for it) gets a ProvisioningRequest (autoscaling.x-k8s.io/v1) of that class with a
PodTemplate of its pods, as Kueue's ProvisioningRequest admission check makes them, so
cluster-autoscaler adds all of the group's nodes or none
(https://github.com/kubernetes/autoscaler/blob/master/cluster-autoscaler/proposals/provisioning-request.md).
Its pods carry the annotations that make them consume it. cluster-autoscaler leaves pods carrying
them out of its ordinary scale-up, so they are written only once the request exists.

Not for a workload steered to a Karpenter NodePool: Karpenter does not serve ProvisioningRequests,
and scales for the pods themselves. Pure: the API writes are webhook/kube/scaleups.py's.
"""
from __future__ import annotations

import hashlib
from typing import Mapping

from ..core.injection import PLACEMENT
from ..core.model import Decision, Outcome
from ..settings.config import Config
from ..state.growth import NODEPOOL_KIND
from .kinds import WorkloadKind
from .templates import pod_templates

GROUP = "autoscaling.x-k8s.io"
VERSION = "v1"
CONSUME = f"{GROUP}/consume-provisioning-request"
CLASS = f"{GROUP}/provisioning-class-name"
NAME_PREFIX = "topology-"


def wanted(decision: Decision, config: Config) -> bool:
    """Whether a decision asks for a ProvisioningRequest: a group of pods that waits, not for a
    Karpenter NodePool, with a class configured."""
    return (bool(config.provisioning_request_class) and decision.outcome is Outcome.WAIT
            and decision.request.pods > 1 and (decision.scope is None or decision.scope.level_name != NODEPOOL_KIND))


def request_name(reservation: str) -> str:
    """One name per workload (its reservation key), a DNS subdomain: the PodTemplate's and the
    ProvisioningRequest's, so creating them again finds them there."""
    return NAME_PREFIX + hashlib.sha256(reservation.encode()).hexdigest()[:20]


def request_objects(namespace: str, name: str, template: Mapping, pods: int, provisioning_class: str,
                    owner: Mapping | None = None) -> tuple[dict, dict]:
    """(PodTemplate, ProvisioningRequest) for `pods` pods of `template` (the pod template as
    admitted: its scheduling fields are what the real pods carry). `owner`: the pods' controller,
    whose deletion then deletes both."""
    meta: dict = {"name": name, "namespace": namespace,
                  "labels": {"app.kubernetes.io/managed-by": "topology-webhook"}}
    if owner:
        meta["ownerReferences"] = [{k: owner[k] for k in ("apiVersion", "kind", "name", "uid") if k in owner}]
    labels = (template.get("metadata") or {}).get("labels")
    pod_template = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": dict(meta),
                    "template": {"metadata": {"labels": dict(labels)} if labels else {},
                                 "spec": template.get("spec") or {}}}
    request = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ProvisioningRequest", "metadata": dict(meta),
               "spec": {"provisioningClassName": provisioning_class,
                        "podSets": [{"podTemplateRef": {"name": name}, "count": pods}]}}
    return pod_template, request


def consumed_by(obj: dict, kind: WorkloadKind, name: str | None, provisioning_class: str = "") -> dict:
    """`obj` (a mutated copy, changed in place) with its pod templates consuming the
    ProvisioningRequest `name`, said in the placement annotation too; None removes a consumption
    of ours (never one a queue such as Kueue wrote)."""
    for found in pod_templates(kind, obj):
        template = found.template
        if not isinstance(template, dict) or not isinstance(template.get("spec"), dict):
            continue
        annotations = (template.get("metadata") or {}).get("annotations")
        if name is None:
            if isinstance(annotations, dict) and str(annotations.get(CONSUME, "")).startswith(NAME_PREFIX):
                del annotations[CONSUME]
                annotations.pop(CLASS, None)
            continue
        annotations = template.setdefault("metadata", {}).setdefault("annotations", {})
        annotations.update({CONSUME: name, CLASS: provisioning_class})
        if PLACEMENT in annotations:
            annotations[PLACEMENT] += f"; ProvisioningRequest {name} ({provisioning_class})"
    return obj
