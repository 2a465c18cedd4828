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

import base64
import dataclasses
import hashlib
import hmac
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from .model import ANNOTATION_PREFIX, MAPPINGS, NO_ROOM_NOW, Decision, Hold, Outcome, PlacementRequest, Strategy

# The comment above each annotation of OUTPUT_ANNOTATIONS is its entry in
# docs/reference/what-we-write.md (.ci/reference_docs.py writes it from here).

# The decision in one line: the strategy, the domain, the pods and GPUs, the interconnect and the
# estimated bandwidth (`consolidated in leaf leaf-3: 32 GPU(s) as 4 pod(s) x 8 on 4 node(s), ...`),
# or what a wait waits for.
PLACEMENT = ANNOTATION_PREFIX + "placement"
# The NVLink-aligned host GPU set (`0-3`), for device plugins and DRA drivers that honour preferred
# allocations; never `CUDA_VISIBLE_DEVICES` ([why](docs/reference/what-we-write.md#nccl-environment-and-gpu-ids)).
GPU_IDS = ANNOTATION_PREFIX + "gpu-ids"
# The key of the hold that keeps the decided GPUs for the workload until its pods are bound
# (`namespace/Kind/name`); the pods made from the template carry it too.
RESERVATION = ANNOTATION_PREFIX + "reservation"
# The record of exactly what we added and where: required expressions per nodeSelectorTerm by
# position, the preferred term, spread constraints, env per container, the workload label, our
# scheduling gate ([`webhook/core/injection.py`](webhook/core/injection.py)). A later pass changes
# or removes only what it lists.
INJECTED = ANNOTATION_PREFIX + "injected"
WORKLOAD_LABEL = ANNOTATION_PREFIX + "workload"
# On the pods of a workload whose wait is pinned: the domain it waits in, as label key=value pairs
# widest first (its path). The cluster index reads it back to keep new work off what it needs
# ([waiting](docs/concepts.md#waiting)).
WAITING_FOR = ANNOTATION_PREFIX + "waiting-for"
# On the pods of a wait held by our scheduling gate: the request as it was decided, which the
# releaser decides again when room opens (the workload's own annotations are not on its pods).
GATED_REQUEST = ANNOTATION_PREFIX + "gated-request"
GATE = ANNOTATION_PREFIX + "placement"  # the name of our entry in spec.schedulingGates
# On the same pods: the seal (a keyed hash, the key shared by the replicas) over what a release
# decides from. A pod's owner may edit its annotations; only what we sealed is believed.
GATE_SEAL = ANNOTATION_PREFIX + "gate-seal"
# The seal over what an unbound pod's own hold is read from (its reservation, GPU set and node: a
# single-pod placement), so that every replica, and one restarted, counts it; only what we sealed
# is believed: a dry run's or another pod's annotations copied onto a pod hold nothing.
HOLD_SEAL = ANNOTATION_PREFIX + "hold-seal"
OUTPUT_ANNOTATIONS = (PLACEMENT, GPU_IDS, RESERVATION, WAITING_FOR, GATED_REQUEST, GATE_SEAL, HOLD_SEAL, INJECTED)
# On the admitted object itself (a Pod's, a Job's metadata; not a template): the uid of the review
# whose placement holds GPUs for it, beside that hold's RESERVATION key. The watch reads them to
# make the hold firm once the apiserver has stored the object as admitted (state/holds.py).
ADMISSION = ANNOTATION_PREFIX + "admission"
# What a sealed request may say at most: far above any cluster, far below what would cost us.
# Admission takes on no template with more node terms (webhook/objects/limits.py): its wait could
# never be released.
_MOST_PODS, _MOST_GPUS_PER_POD, MOST_NODE_TERMS = 100_000, 1024, 64
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
        # orjson: the bytes json.dumps(sort_keys=True, separators=(",", ":")) gives for ASCII, in a
        # tenth of the time; it writes other text as UTF-8 where json escapes it, and loads reads both.
        return orjson.dumps({k: v for k, v in data.items() if v}, option=orjson.OPT_SORT_KEYS).decode()

    @classmethod
    def loads(cls, text: object) -> "Injection":
        """The record of a template; anything unreadable means we own nothing there."""
        try:
            # orjson reads what dumps can write back (no NaN, no infinity, integers that fit 64 bits)
            data = orjson.loads(text) if isinstance(text, str) else {}
            env = {str(c): {str(k): str(v) for k, v in names.items()} for c, names in data.get("env", {}).items()}
            required = tuple(tuple(e for e in term if isinstance(e, dict)) for term in data.get("required_terms", ()))
            return cls(required, data.get("preferred"), tuple(data.get("spread", ())), env, data.get("label"),
                       data.get("gated") is True)
        except (ValueError, TypeError, AttributeError):
            return cls()


def dumps_request(request: PlacementRequest) -> str:
    """GATED_REQUEST's value: every field of the request, as JSON, but the domain a replica
    searched first (its allotment's, not the workload's wish; and read by replicas of every version)."""
    data = dataclasses.asdict(request)
    del data["search_first"]
    data["strategy"] = request.strategy.value
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


def loads_request(text: object) -> PlacementRequest | None:
    """The request GATED_REQUEST holds; None when it holds none (written by someone else, or by
    another version of ours with other fields) or one the core could not decide (no pods, a
    count that is not a whole number, node terms that are not terms)."""
    try:
        data = json.loads(text) if isinstance(text, str) else None
        if not isinstance(data, dict):
            return None
        request = PlacementRequest(**{
            **data, "strategy": Strategy(data["strategy"]),
            "node_selector": {str(k): str(v) for k, v in dict(data["node_selector"]).items()},
            "required_node_terms": tuple(data["required_node_terms"]),
            "tolerations": tuple(data["tolerations"]),
            "resources": tuple((str(name), int(amount)) for name, amount in data["resources"])})
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
    return request if _decidable(request) else None


def _decidable(request: PlacementRequest) -> bool:
    counts = (request.pods, request.gpus_per_pod)
    if any(isinstance(n, bool) or not isinstance(n, int) for n in counts):
        return False
    if not (1 <= request.pods <= _MOST_PODS and 0 <= request.gpus_per_pod <= _MOST_GPUS_PER_POD):
        return False
    texts = (request.workload, request.preferred_domain or "", request.max_domain or "")
    if not all(isinstance(t, str) for t in texts) or not isinstance(request.latency_sensitive, bool):
        return False
    if request.min_bandwidth_gbps is not None and (isinstance(request.min_bandwidth_gbps, bool) or not isinstance(
            request.min_bandwidth_gbps, (int, float))):
        return False
    terms = request.required_node_terms
    return len(terms) <= MOST_NODE_TERMS and all(_node_term(t) for t in terms) and all(
        isinstance(t, MAPPINGS) for t in request.tolerations) and all(n >= 0 for _, n in request.resources)


def _node_term(term: object) -> bool:
    """A nodeSelectorTerm: lists of {key, operator, values} requirements."""
    if not isinstance(term, MAPPINGS):
        return False
    for part in ("matchExpressions", "matchFields"):
        expressions = term.get(part) or []
        if not isinstance(expressions, list) or not all(
                isinstance(e, MAPPINGS) and isinstance(e.get("key"), str) and isinstance(e.get("operator"), str)
                and isinstance(e.get("values") or [], list) for e in expressions):
            return False
    return True


def seal_gate(key: bytes, reservation: str, request_text: str, waiting_text: str) -> str:
    """GATE_SEAL's value: a MAC, under a key only the webhook reads, over what a release decides
    from. The reservation key names the workload's namespace (namespace/Kind/name), so a record
    sealed for one namespace never verifies on a pod of another."""
    message = "\0".join(("gate-seal/v1", reservation, request_text, waiting_text)).encode()
    return base64.urlsafe_b64encode(hmac.new(key, message, hashlib.sha256).digest()).decode().rstrip("=")


def seal_hold(key: bytes, reservation: str, gpu_ids: str, node: str) -> str:
    """HOLD_SEAL's value: a MAC over what an unbound pod's hold is read from (see seal_gate)."""
    message = "\0".join(("hold-seal/v1", reservation, gpu_ids, node)).encode()
    return base64.urlsafe_b64encode(hmac.new(key, message, hashlib.sha256).digest()).decode().rstrip("=")


@dataclass(frozen=True)
class GateRecord:
    """What a gated pod's annotations say its release decides from, sealed by us."""

    reservation: str
    request: PlacementRequest
    path: tuple[tuple[str, str], ...]
    owner: str = ""  # the uid of its controller where its reservation names that controller (a Job)


def gate_record(annotations: Mapping, namespace: str, key: bytes) -> GateRecord | str:
    """The sealed record on a gated pod of `namespace`, or why it is not believed."""
    reservation, request_text = annotations.get(RESERVATION), annotations.get(GATED_REQUEST)
    waiting_text, seal = annotations.get(WAITING_FOR), annotations.get(GATE_SEAL)
    if not all(isinstance(v, str) and v for v in (reservation, request_text, waiting_text, seal)):
        return f"it lacks one of {RESERVATION}, {GATED_REQUEST}, {WAITING_FOR}, {GATE_SEAL}"
    assert isinstance(reservation, str) and isinstance(request_text, str) and isinstance(waiting_text, str)
    if not reservation.startswith(f"{namespace}/"):
        return f"its {RESERVATION} {reservation[:120]!r} names a workload outside namespace {namespace}"
    if not hmac.compare_digest(str(seal), seal_gate(key, reservation, request_text, waiting_text)):
        return f"its {GATE_SEAL} does not match what it says (edited after the webhook wrote it, or not written by it)"
    request, path = loads_request(request_text), parse_domain_path(waiting_text)
    if request is None or not path:
        return f"its {GATED_REQUEST} or {WAITING_FOR} cannot be decided"
    return GateRecord(reservation, request, path)


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
    found = meta.get("annotations") if isinstance(meta, MAPPINGS) else None
    return found if isinstance(found, MAPPINGS) else {}


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


def waited_domain(decision: Decision) -> str | None:
    """The WAITING_FOR annotation of a decision that carries its hold: the domain a pinned or
    gated wait for room waits in (not one for nodes to be added), which the cluster index
    protects for it (placement/protection.py)."""
    if decision.outcome is not Outcome.WAIT or decision.code != NO_ROOM_NOW or decision.scope is None:
        return None
    held = decision.hold in (Hold.PIN, Hold.GATE)
    return format_domain_path(decision.scope.path) if decision.scope.path and held else None
