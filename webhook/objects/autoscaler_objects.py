"""Autoscalers' objects read into the facts state/growth.py keeps: a Karpenter NodePool into its
pool, cluster-autoscaler's status ConfigMap into its node groups. What the pools mean is told in
state/growth.py."""
from __future__ import annotations

import re
from typing import Any, Mapping

import yaml

from ..core.gpus import ASCII_DIGITS, quantity_to_int
from ..core.model import GPU_RESOURCE
from ..state.growth import (CA_STATUS_NAME, CA_STATUS_NAMESPACE, NODEPOOL_GROUP, NODEPOOL_KIND, NODEPOOL_LABEL,
                            GrowthFact, Pool)

GPU_COUNT_LABELS = ("karpenter.k8s.aws/instance-gpu-count", "eks.amazonaws.com/instance-gpu-count",
                    "karpenter.azure.com/sku-gpu-count")
# GPUs of the EC2 GPU instance types a NodePool may name instead of a GPU count.
INSTANCE_GPUS = {"p4d.24xlarge": 8, "p4de.24xlarge": 8, "p5.48xlarge": 8, "p5e.48xlarge": 8, "p5en.48xlarge": 8,
                 "p6-b200.48xlarge": 8, "g6e.48xlarge": 8, "g5.48xlarge": 8}
_INSTANCE_TYPE = "node.kubernetes.io/instance-type"
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml: a large status reads in a moment



def is_growth_object(obj: Mapping, kind: str) -> bool:
    """A Karpenter NodePool, or cluster-autoscaler's status ConfigMap (`kind`: the object's, or
    its list's, whose items carry none)."""
    meta = obj.get("metadata") or {}
    if kind == NODEPOOL_KIND:
        return str(obj.get("apiVersion") or NODEPOOL_GROUP + "/").startswith(NODEPOOL_GROUP + "/")
    return (kind == "ConfigMap" and meta.get("name") == CA_STATUS_NAME
            and (meta.get("namespace") or CA_STATUS_NAMESPACE) == CA_STATUS_NAMESPACE)


def object_key(obj: Mapping, kind: str) -> str:
    meta = obj.get("metadata") or {}
    return f"{kind}/{meta.get('namespace') or ''}/{meta.get('name') or ''}"


def node_groups(status: Mapping) -> list[tuple[str, int]]:
    """(group name, nodes it may still add) for each healthy node group not backing off, from
    the status ConfigMap. The free-text status of cluster-autoscaler before 1.30 yields none."""
    try:
        parsed = yaml.load(str((status.get("data") or {}).get("status") or ""), Loader=_YAML_LOADER)
    except (yaml.YAMLError, RecursionError):
        return []
    groups = parsed.get("nodeGroups") if isinstance(parsed, dict) else None
    out = []
    for group in groups if isinstance(groups, list) else ():
        if not isinstance(group, dict):
            continue
        health, scale_up = _field(group, "health"), _field(group, "scaleUp")
        if health.get("status", "Healthy") != "Healthy" or scale_up.get("status") == "Backoff":
            continue
        try:
            headroom = int(health["maxSize"]) - int(health.get("cloudProviderTarget", 0))
        except (KeyError, TypeError, ValueError):
            continue
        name = group.get("name") or ""
        if isinstance(name, (str, int, float)):  # never str() of a structure: aliases could make it endless
            out.append((str(name), headroom))
    return out



def nodepool(obj: Mapping) -> Pool | None:
    """A Karpenter NodePool as a pool, without its nodes (state/growth.py adds them); None when it
    does not grow for pods (static, not Ready, or no name)."""
    meta, spec, status = _field(obj, "metadata"), _field(obj, "spec"), _field(obj, "status")
    name = str(meta.get("name") or "")
    if not name or spec.get("replicas") is not None:
        return None
    if any(isinstance(c, dict) and c.get("type") == "Ready" and c.get("status") == "False"
           for c in status.get("conditions") or ()):
        return None
    template = _field(spec, "template")
    template_meta, template_spec = _field(template, "metadata"), _field(template, "spec")
    fixed = {str(k): str(v) for k, v in (template_meta.get("labels") or {}).items()}
    fixed[NODEPOOL_LABEL] = name
    choices: dict[str, tuple[str, ...]] = {}
    excluded: dict[str, frozenset[str]] = {}
    unknown: set[str] = set()
    absent: set[str] = set()
    bounds: dict[str, list[tuple[str, int]]] = {}  # numeric bounds on a key, e.g. a GPU count
    for req in template_spec.get("requirements") or ():
        if not isinstance(req, dict) or not req.get("key"):
            continue
        key, op, values = str(req["key"]), req.get("operator"), tuple(str(v) for v in req.get("values") or ())
        if op == "In" and key not in fixed:
            allowed = tuple(sorted(set(values) & set(choices[key]))) if key in choices else tuple(sorted(set(values)))
            if len(allowed) == 1:
                fixed[key] = allowed[0]
                choices.pop(key, None)
            else:
                choices[key] = allowed
        elif op == "NotIn":
            excluded[key] = excluded.get(key, frozenset()) | frozenset(values)
        elif op == "DoesNotExist":
            absent.add(key)
        elif op in ("Exists", "Gt", "Lt", "Gte", "Lte"):
            unknown.add(key)
            if op != "Exists" and values and re.fullmatch(ASCII_DIGITS, values[0]):
                bounds.setdefault(key, []).append((str(op), int(values[0])))
    taints = tuple((str(t.get("key", "")), str(t.get("value", "") or ""), str(t.get("effect", "")))
                   for t in template_spec.get("taints") or () if isinstance(t, dict)
                   and t.get("effect") in ("NoSchedule", "NoExecute"))
    room_nodes, room_gpus = _room(_field(spec, "limits"), status)
    try:
        weight = int(spec.get("weight") or 0)
    except (TypeError, ValueError):
        weight = 0
    return Pool(NODEPOOL_KIND, name, (NODEPOOL_LABEL, name), fixed, choices, frozenset(unknown),
                excluded=excluded, absent=frozenset(absent), catalog_keys=True, taints=taints,
                gpus_per_node=_gpus_per_node(fixed, choices, bounds), room_nodes=room_nodes,
                room_gpus=room_gpus, weight=weight)


def _gpus_per_node(fixed: Mapping[str, str], choices: Mapping[str, tuple[str, ...]],
                   bounds: Mapping[str, list[tuple[str, int]]]) -> int | None:
    """The most GPUs a new node of the NodePool may have: its GPU-count requirement, else its
    instance types; None when neither says (then the largest of its nodes there are)."""
    for key in GPU_COUNT_LABELS:
        counts = [fixed[key]] if key in fixed else list(choices.get(key, ()))
        whole = [int(c) for c in counts if re.fullmatch(ASCII_DIGITS, c)]
        if whole:
            return max(whole)
        upper = [bound - (op == "Lt") for op, bound in bounds.get(key, ()) if op in ("Lt", "Lte")]
        if upper:
            return min(upper)
    types = [fixed[_INSTANCE_TYPE]] if _INSTANCE_TYPE in fixed else list(choices.get(_INSTANCE_TYPE, ()))
    if types and all(t in INSTANCE_GPUS for t in types):
        return max(INSTANCE_GPUS[t] for t in types)
    return None


def _field(obj: Mapping, key: str) -> Mapping[str, Any]:
    """A mapping field of an API object; {} when it is missing or not a mapping (input we read
    is never trusted to have its schema's shape)."""
    value = obj.get(key)
    return value if isinstance(value, dict) else {}


def _room(limits: Mapping, status: Mapping) -> tuple[int | None, int | None]:
    """(nodes, GPUs) a NodePool may still add under its limits; None where it sets none."""
    used = _field(status, "resources")
    out: list[int | None] = []
    for resource, in_use in (("nodes", status.get("nodes", used.get("nodes", 0))),
                             (GPU_RESOURCE, used.get(GPU_RESOURCE, 0))):
        try:
            out.append(None if resource not in limits else
                       max(0, quantity_to_int(limits[resource]) - quantity_to_int(in_use or 0)))
        except ValueError:
            out.append(None)
    return out[0], out[1]


def growth_fact(obj: Mapping, kind: str) -> GrowthFact | None:
    """A NodePool or cluster-autoscaler's status ConfigMap, added or changed; None for any other object."""
    if not is_growth_object(obj, kind):
        return None
    return GrowthFact(object_key(obj, kind), nodepool(obj) if kind == NODEPOOL_KIND else tuple(node_groups(obj)))


def growth_gone(obj: Mapping, kind: str) -> GrowthFact | None:
    return GrowthFact(object_key(obj, kind), None, gone=True) if is_growth_object(obj, kind) else None
