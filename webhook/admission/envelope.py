"""The AdmissionReview envelope: a parsed review in, the review to send back out, and the one
vocabulary of outcomes every answer is given under.

Two error channels, decided here: a body that is not an AdmissionReview raises MalformedReview
(the app answers HTTP 400 with its one-line message); everything about the object itself is an
answer inside a 200 review (allowed, patched, warned or denied).
"""
from __future__ import annotations

import enum
import hashlib
import json
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

from ..core.model import MAPPINGS, Decision, quoted
from ..objects.kinds import kind_of
from ..objects.limits import oversized_annotations
from ..objects.templates import display_name, mapping_of
from ..objects.patch import encode, make_patch

REVIEW_API_VERSIONS = ("admission.k8s.io/v1", "admission.k8s.io/v1beta1")
WARNING_MAX_CHARS = 256  # the apiserver truncates longer warnings once its budget is spent
DENIED_CODE = 403
_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")


class AdmissionOutcome(str, enum.Enum):
    """What became of one review: the log's, the metrics' and the audit annotations' `outcome`."""

    PLACED = "placed"
    WAITING = "waiting"
    WAITING_FOR_NODES = "waiting-for-nodes"
    WAITING_FOR_GROWTH = "waiting-for-growth"
    DENIED = "denied"
    FAILED_OPEN = "failed-open"
    NOT_READY = "not-ready"
    SUSPENDED = "suspended"
    MANAGED_ELSEWHERE = "managed-elsewhere"
    REPAIRED = "repaired"
    DEMAND_UNKNOWN = "demand-unknown"
    CONSTRAINED = "constrained"
    ALIGNED = "aligned"
    IGNORED = "ignored"

    def __str__(self) -> str:  # the value, in logs, metric labels and f-strings alike (Python 3.10 to 3.13)
        return self.value


# What each outcome means; the outcomes are the label values of topology_placement_decisions_total
# (all but "ignored", counted in latency only), the log's and the audit annotations' `outcome`, and
# docs/reference/metrics.md (generated from this mapping by .ci/reference_docs.py).
OUTCOMES: Mapping[AdmissionOutcome, str] = {
    AdmissionOutcome.PLACED: "placed where it fits now",
    AdmissionOutcome.WAITING: "admitted to wait for room: pinned to, held for (our scheduling gate) or preferring the domain "
               "where it fits first ([waiting](docs/concepts.md#waiting))",
    AdmissionOutcome.WAITING_FOR_NODES: "admitted to wait for nodes to be added: the nodes there are cannot hold it even when idle "
                         "([autoscalers](docs/autoscalers.md))",
    AdmissionOutcome.WAITING_FOR_GROWTH: "steered to a node pool an autoscaler can grow: the nodes there are have no room "
                          "([autoscalers](docs/autoscalers.md))",
    AdmissionOutcome.DENIED: "refused: invalid input, or a workload no node could ever hold with `refuse_unplaceable`",
    AdmissionOutcome.FAILED_OPEN: "admitted unmodified because of an error of ours (also counted in "
                   "`topology_admission_fail_open_total`)",
    AdmissionOutcome.NOT_READY: "admitted unmodified while the cluster view is not ready",
    AdmissionOutcome.SUSPENDED: "a suspended workload (a Job a queue such as Kueue holds back) admitted unplaced, holding nothing; "
                 "placed by the update that un-suspends it",
    AdmissionOutcome.MANAGED_ELSEWHERE: "placed by another queue or scheduler (a pod Kueue queues, a workload of Kueue's "
                         "topology-aware scheduling, pods naming another scheduler): admitted unchanged, holding nothing "
                         "([queues](docs/operators-and-queues.md#kueue-kai-and-other-schedulers))",
    AdmissionOutcome.REPAIRED: "a pod of a placed workload whose pinned domain lost the capacity to ever hold it, placed again alone",
    AdmissionOutcome.DEMAND_UNKNOWN: "admitted as written: GPUs asked through a ResourceClaimTemplate or claim not known yet "
                      "([DRA](docs/dra.md))",
    AdmissionOutcome.CONSTRAINED: "a PodGroup or Workload given the topology key of the level it asks for ([DRA](docs/dra.md))",
    AdmissionOutcome.ALIGNED: "a ResourceClaimTemplate given the device constraint it asks for ([DRA](docs/dra.md))",
    AdmissionOutcome.IGNORED: "nothing to place or keep (not ours, or an object or operation left alone); admitted unchanged",
}


class MalformedReview(ValueError):
    """The body is not an AdmissionReview; the app answers HTTP 400 with str(err)."""


@dataclass(frozen=True)
class AdmissionResult:
    review: dict  # AdmissionReview to send back, same apiVersion as received (v1 or v1beta1)
    uid: str
    kind: str  # "Pod", "Job", ... ("" when the review had none)
    namespace: str
    name: str  # metadata.name, else generateName
    outcome: AdmissionOutcome
    strategy: str | None
    decision: Decision | None
    warnings: tuple[str, ...]
    error: str | None  # failed-open only: exception type and message, for logs; never object contents
    patch: tuple[dict, ...] = ()  # the JSON Patch operations in the answer
    admitted: dict | None = None  # the object as admitted (the patch applied); None when denied


@dataclass(frozen=True)
class Request:
    """What a review asks about, read once from its request."""

    api_version: str
    uid: str
    group: str
    kind: str
    operation: str
    namespace: str
    name: str
    obj: dict | None
    old: dict | None  # UPDATE: the stored object
    dry_run: bool


def make_review(obj: Mapping, operation: str = "CREATE", namespace: str | None = None, dry_run: bool = False,
                uid: str | None = None) -> dict:
    """A v1 AdmissionReview for `obj` shaped as the apiserver sends it (offline `mutate`, tests).
    Without a uid, one is derived from the object so the same manifest gives the same review."""
    meta = mapping_of(obj.get("metadata"))
    group, _, version = str(obj.get("apiVersion") or "").rpartition("/")
    kind = str(obj.get("kind") or "")
    if uid is None:
        digest = hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()
        uid = str(uuid.UUID(digest[:32]))
    gvk = {"group": group, "version": version, "kind": kind}
    gvr = {"group": group, "version": version, "resource": kind.lower() + "s"}
    request = {"uid": uid, "kind": gvk, "resource": gvr, "requestKind": gvk, "requestResource": gvr,
               "namespace": namespace or meta.get("namespace") or "default", "operation": operation,
               "userInfo": {"username": "topology-webhook-offline"}, "object": dict(obj), "oldObject": None,
               "dryRun": dry_run, "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"}}
    if meta.get("name"):
        request["name"] = meta["name"]
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def parse(body: object) -> Request:
    """The review's request; raises MalformedReview for a body that is not an AdmissionReview."""
    if not isinstance(body, MAPPINGS):
        raise MalformedReview(f"body is a JSON {type(body).__name__}, not an AdmissionReview object")
    if body.get("kind") != "AdmissionReview":
        raise MalformedReview(f"kind is {quoted(body.get('kind'))}, expected 'AdmissionReview'")
    api_version = body.get("apiVersion")
    if api_version not in REVIEW_API_VERSIONS:
        raise MalformedReview(f"apiVersion {quoted(api_version)} is not one of {', '.join(REVIEW_API_VERSIONS)}")
    request = body.get("request")
    if not isinstance(request, MAPPINGS):
        raise MalformedReview("request is missing or not an object")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise MalformedReview("request.uid is missing or not a string")
    operation = request.get("operation")
    obj = request.get("object")
    if operation in ("CREATE", "UPDATE") and not isinstance(obj, dict):
        raise MalformedReview(f"request.object is not an object on {operation}")
    gvk = mapping_of(request.get("kind"))
    meta = mapping_of(obj.get("metadata") if isinstance(obj, dict) else None)
    group = gvk.get("group")
    if group is None and isinstance(obj, dict):
        group = str(obj.get("apiVersion") or "").rpartition("/")[0]
    kind = gvk.get("kind") or (obj.get("kind") if isinstance(obj, dict) else "") or ""
    return Request(
        api_version=api_version, uid=uid, group=str(group or ""), kind=str(kind), operation=str(operation or ""),
        # request.namespace is authoritative: controller-made pods may lack metadata.namespace
        namespace=str(request.get("namespace") or meta.get("namespace") or "default"),
        name=str(meta.get("name") or meta.get("generateName") or request.get("name") or ""),
        obj=obj if isinstance(obj, dict) else None,
        old=request.get("oldObject") if isinstance(request.get("oldObject"), dict) else None,
        dry_run=request.get("dryRun") is True)


def denied(request: Request, message: str, decision: Decision | None = None) -> AdmissionResult:
    return answer(request, AdmissionOutcome.DENIED, decision=decision,
                  status={"code": DENIED_CODE, "message": _one_line(message)})


def answer(request: Request, outcome: AdmissionOutcome, decision: Decision | None = None,
           mutated: dict | None = None, warnings: list[str] | None = None, status: dict | None = None,
           error: str | None = None) -> AdmissionResult:
    """The answer. `mutated`: the object as we would have it (its JSON Patch from the received
    object goes into the answer); None leaves the object as it came. An object the apiserver would
    refuse for its annotations' size is never sent back: the answer is a denial that says so."""
    if mutated is not None and status is None:
        kind = kind_of(request.group, request.kind)
        oversized = oversized_annotations(kind, mutated, display_name(kind.key if kind else request.kind, mutated,
                                                                      request.namespace))
        if oversized is not None:
            return denied(request, oversized, decision)
    operations = make_patch(request.obj, mutated) if mutated is not None and request.obj is not None else []
    clean: list[str] = []
    for text in warnings or ():
        line = _one_line(text)[:WARNING_MAX_CHARS]
        if line and line not in clean:
            clean.append(line)
    response: dict = {"uid": request.uid, "allowed": status is None}
    if operations:
        response["patchType"] = "JSONPatch"
        response["patch"] = encode(operations)
    if status is not None:
        response["status"] = status
    if clean:
        response["warnings"] = clean
    audit = _audit(outcome, decision)
    if audit:
        response["auditAnnotations"] = audit
    strategy = decision.request.strategy.value if decision is not None else None
    return AdmissionResult(
        review={"apiVersion": request.api_version, "kind": "AdmissionReview", "response": response},
        uid=request.uid, kind=request.kind, namespace=request.namespace, name=request.name, outcome=outcome,
        strategy=strategy, decision=decision, warnings=tuple(clean), error=error, patch=tuple(operations),
        admitted=None if status is not None else (mutated if mutated is not None else request.obj))


def _audit(outcome: AdmissionOutcome, decision: Decision | None) -> dict[str, str]:
    """Audit annotations (stored as <webhook name>/<key>); keys are valid label name segments."""
    if outcome is AdmissionOutcome.IGNORED:
        return {}
    audit = {"outcome": outcome.value}
    if decision is not None:
        audit["strategy"] = decision.request.strategy.value
        audit["gpus"] = str(decision.request.total_gpus)
        if decision.scope is not None:
            audit["domain"] = str(decision.scope)
        if decision.code:
            audit["reason"] = decision.code
    return audit


def _one_line(text: str) -> str:
    return _CONTROL.sub(" ", str(text)).strip()
