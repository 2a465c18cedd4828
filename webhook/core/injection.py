"""What is ours in a pod template: the record of what the webhook added, and the names it writes.

Every item we add to a pod template is recorded in the template annotation
`topology.scheduler/injected`, per place: the required node-affinity expressions per
nodeSelectorTerm (by position), the one preferred term, the spread constraints, the env per
container, the workload label, our scheduling gate. Only what is recorded is ever changed or removed by a later pass,
so a user's item is never taken for ours, even when it is identical to one we add elsewhere (the
same expression in another ORed term, say). Both the reading side (workload: which annotations
are ours) and the writing side (mutation) use this module; it holds no logic of either.
"""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .model import ANNOTATION_PREFIX, PlacementRequest, Strategy

PLACEMENT = ANNOTATION_PREFIX + "placement"
GPU_IDS = ANNOTATION_PREFIX + "gpu-ids"
RESERVATION = ANNOTATION_PREFIX + "reservation"
INJECTED = ANNOTATION_PREFIX + "injected"
WORKLOAD_LABEL = ANNOTATION_PREFIX + "workload"
# On the pods of a workload whose wait is pinned: the domain it waits in, as label key=value pairs
# widest first (its path). The cluster index reads it back to keep new work off what it needs.
WAITING_FOR = ANNOTATION_PREFIX + "waiting-for"
# On the pods of a wait held by our scheduling gate (GATE): the request as it was decided, which
# the releaser decides again when room opens (the workload's own annotations are not on its pods).
GATED_REQUEST = ANNOTATION_PREFIX + "gated-request"
GATE = ANNOTATION_PREFIX + "placement"  # the name of our entry in spec.schedulingGates
OUTPUT_ANNOTATIONS = (PLACEMENT, GPU_IDS, RESERVATION, WAITING_FOR, GATED_REQUEST, INJECTED)
REQUIRED_TERMS = ("affinity", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution", "nodeSelectorTerms")
PREFERRED = ("affinity", "nodeAffinity", "preferredDuringSchedulingIgnoredDuringExecution")


@dataclass(frozen=True)
class Injection:
    """What we own in a pod template: compared by equality, so a user's edit makes it theirs."""

    required: tuple[tuple[dict, ...], ...] = ()  # per nodeSelectorTerm, by position: expressions we added
    preferred: dict | None = None  # one preferredDuringScheduling entry
    spread: tuple[dict, ...] = ()  # topologySpreadConstraints
    env: Mapping[str, Mapping[str, str]] = field(default_factory=dict)  # container -> {name: value}
    label: str | None = None  # value of WORKLOAD_LABEL, when we added it
    gated: bool = False  # we added GATE to spec.schedulingGates

    def dumps(self) -> str:
        required = [list(term) for term in self.required] if any(self.required) else None
        data = {"required_terms": required, "preferred": self.preferred, "spread": list(self.spread),
                "env": {c: dict(v) for c, v in self.env.items() if v}, "label": self.label, "gated": self.gated}
        return json.dumps({k: v for k, v in data.items() if v}, sort_keys=True, separators=(",", ":"))

    @classmethod
    def loads(cls, text: object) -> "Injection":
        """The record of a template; anything unreadable means we own nothing there."""
        try:
            data = json.loads(text) if isinstance(text, str) else {}
            env = {str(c): {str(k): str(v) for k, v in names.items()} for c, names in data.get("env", {}).items()}
            required = tuple(tuple(e for e in term if isinstance(e, dict)) for term in data.get("required_terms", ()))
            return cls(required, data.get("preferred"), tuple(data.get("spread", ())), env, data.get("label"),
                       data.get("gated") is True)
        except (ValueError, TypeError, AttributeError):
            return cls()


def dumps_request(request: PlacementRequest) -> str:
    """GATED_REQUEST's value: every field of the request, as JSON."""
    data = dataclasses.asdict(request)
    data["strategy"] = request.strategy.value
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


def loads_request(text: object) -> PlacementRequest | None:
    """The request GATED_REQUEST holds; None when it holds none (written by someone else, or by
    another version of ours with other fields)."""
    try:
        data = json.loads(text) if isinstance(text, str) else None
        if not isinstance(data, dict):
            return None
        return PlacementRequest(**{
            **data, "strategy": Strategy(data["strategy"]),
            "node_selector": dict(data["node_selector"]),
            "required_node_terms": tuple(data["required_node_terms"]),
            "tolerations": tuple(data["tolerations"]),
            "resources": tuple((str(name), int(amount)) for name, amount in data["resources"])})
    except (ValueError, TypeError, KeyError):
        return None


def format_domain_path(path: tuple[tuple[str, str], ...]) -> str:
    """A domain's path as WAITING_FOR writes it: `key=value,key=value`, widest first."""
    return ",".join(f"{key}={value}" for key, value in path)


def parse_domain_path(text: object) -> tuple[tuple[str, str], ...] | None:
    """The path WAITING_FOR names; None when it is not one (a label value holds no `,` or `=`)."""
    if not isinstance(text, str) or not text:
        return None
    pairs = [part.partition("=") for part in text.split(",")]
    if any(not key or not sep for key, sep, _ in pairs):
        return None
    return tuple((key, value) for key, _, value in pairs)


def annotations_of(template: Mapping | None) -> Mapping:
    """The template's annotations; {} when absent or not a map (a DELETE's stored object is not
    shape-checked)."""
    meta = (template or {}).get("metadata")
    found = meta.get("annotations") if isinstance(meta, Mapping) else None
    return found if isinstance(found, Mapping) else {}


def recorded(template: Mapping | None) -> Injection:
    return Injection.loads(annotations_of(template).get(INJECTED))


def reservation_of(template: Mapping | None) -> str | None:
    """The reservation key written on the pod template when the workload was placed."""
    key = annotations_of(template).get(RESERVATION)
    return str(key) if key else None


def already_placed(template: Mapping | None) -> bool:
    """The template carries our placement summary and every item we recorded, where we put it."""
    if PLACEMENT not in annotations_of(template):
        return False
    record = recorded(template)
    spec = (template or {}).get("spec") or {}
    terms = at(spec, REQUIRED_TERMS) or []
    pinned = len(record.required) <= len(terms) and all(
        isinstance(term, dict) and all(e in (term.get("matchExpressions") or []) for e in ours)
        for term, ours in zip(terms, record.required))
    preferred = record.preferred is None or record.preferred in (at(spec, PREFERRED) or [])
    spread = all(c in (spec.get("topologySpreadConstraints") or []) for c in record.spread)
    gated = not record.gated or {"name": GATE} in (spec.get("schedulingGates") or [])
    return pinned and preferred and spread and gated


def at(node: Any, path: tuple[str, ...]) -> Any:
    """What `path` leads to through nested dicts, or None."""
    for key in path:
        node = node.get(key) if isinstance(node, dict) else None
    return node
