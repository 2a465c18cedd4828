"""PodGroups and Workloads (`scheduling.k8s.io/v1beta1`, and `v1alpha2` of Kubernetes 1.36, whose
topology constraint has the same shape; kube-scheduler's gang and topology-aware workload
scheduling) at their CREATE: the level a `topology.scheduler/max-domain` (or a peer's
required-topology) annotation asks for becomes their topology constraint.

A PodGroup is created before its pods, so at its CREATE no pod says where the group goes; only
an annotation can say at which level it must stay together. Written as
`spec.schedulingConstraints.topology: [{key: <that level's node label>}]` (on a Workload, in each
of its `podGroupTemplates`), kube-scheduler keeps the gang inside one domain of that level, the
level our node affinity pins its pods to. A constraint the user wrote is never replaced (the
field is immutable after creation, and holds at most one entry). Pure: objects in, values out.
"""
from __future__ import annotations

import copy
from collections.abc import Mapping

from ..core.model import quoted
from ..settings.config import Config
from ..settings.presets import HOSTNAME_LABEL
from ..state.dra import SCHEDULING_GROUP
from .templates import display_name, mapping_of
from .user_annotations import MAX_DOMAIN, PEER_REQUIRED, InvalidAnnotation

KINDS = ("PodGroup", "Workload")


def handles(group: str, kind: str) -> bool:
    return group == SCHEDULING_GROUP and kind in KINDS


def level_label(level: str, config: Config) -> str | None:
    """The node label key of a level named by its name or label key; None for no level."""
    for configured in config.levels:
        if level in (configured.name, configured.label):
            return configured.label
    return HOSTNAME_LABEL if level in ("node", HOSTNAME_LABEL) else None


def constrained(kind: str, obj: Mapping, namespace: str, config: Config) -> tuple[dict | None, str]:
    """(the object with its topology constraint written, or None to leave it as it is; why, for
    people). Raises InvalidAnnotation for a level that is not one of the configured levels."""
    who = display_name(kind, obj, namespace)
    annotations = mapping_of(mapping_of(obj.get("metadata")).get("annotations"))
    key = next((k for k in (MAX_DOMAIN, *PEER_REQUIRED) if k in annotations), None)
    if key is None:
        return None, f"{who} asks for no level"
    label = level_label(str(annotations[key]).strip(), config)
    if label is None:
        allowed = ", ".join([lv.name for lv in config.levels] + ["node"] + [lv.label for lv in config.levels])
        raise InvalidAnnotation(f"{who}: annotation {key}={quoted(annotations[key])} is not a topology level; "
                                f"allowed: {allowed}")
    out = copy.deepcopy(dict(obj))
    spec = out.get("spec")
    if not isinstance(spec, dict):
        return None, f"{who} has no spec"
    groups = [spec] if kind == "PodGroup" else [t for t in spec.get("podGroupTemplates") or () if isinstance(t, dict)]
    written = 0
    for group in groups:
        constraints = group.get("schedulingConstraints")
        if constraints is not None and not isinstance(constraints, dict):
            continue
        if constraints and constraints.get("topology"):
            continue  # the user's own: kept
        group["schedulingConstraints"] = {**(constraints or {}), "topology": [{"key": label}]}
        written += 1
    if not written:
        return None, f"{who} keeps its own topology constraint"
    return out, f"{who}: topology key {label} (from {key})"
