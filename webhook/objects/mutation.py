"""Turn a placement decision into a new object: affinity, spread, NCCL env and annotations.

Pure: returns a new object and never changes the one it was given. Everything we add to a pod
template is recorded where we put it (webhook/core/injection.py), so a later pass (apiserver
reinvocation, a controller copying the template, an UPDATE) can tell our items from the user's:
ours are replaced in place or removed, the user's are never touched, even when identical to one
of ours, and applying the same decision to our own output changes nothing (the reconciling itself:
webhook/objects/reconcile.py).

What goes where (how a decision is held, pin, prefer or gate, is decided in placement/enforce.py and
carried on the Decision; it is written here):
- A pinned decision becomes required nodeAffinity, the expressions added to every existing
  nodeSelectorTerm because terms are ORed (an empty term `{}` matches no node in Kubernetes and
  is left as it is); a preferring one, preferred nodeAffinity.
- A gated wait gets our scheduling gate instead of the pin, with the request it was decided as
  (`gated-request`): the releaser (webhook/kube/releaser.py) decides it again when room opens
  and `released` writes the pin it chose then and lifts the gate.
- `distributed` adds topologySpreadConstraints on the decision's spread keys, selecting the pods
  by the template label `topology.scheduler/workload`; a (topologyKey, whenUnsatisfiable) pair
  the user already has is left alone (the API rejects duplicates).
- App and sidecar containers that request GPUs get the NCCL profile of the interconnect the job
  crosses (none for a 1-GPU workload: it talks to no one) and CUDA_DEVICE_ORDER=PCI_BUS_ID; a
  variable the user set is never overridden. Init containers that are not sidecars get none: they
  run one at a time, before the ranks start, and take no part in the job's communicators.
- Annotations on the template: `placement` (summary), `gpu-ids` (NVLink-aligned host GPU set of a
  single-pod workload, a hint for device plugins and DRA drivers: the container renumbers its
  GPUs from 0, so host indices never go into CUDA_VISIBLE_DEVICES), `reservation` (the key the
  cluster index confirms once pods are bound), `waiting-for` (the domain a pinned or gated wait
  waits in), `gated-request`, `injected` (the record above).
"""
from __future__ import annotations

import dataclasses
import hashlib
import re
from typing import Mapping

from ..core.gpus import container_gpus, format_gpu_set
from ..settings.config import Config
from ..settings.presets import HOSTNAME_LABEL
from ..core.injection import (ADMISSION, GATE, GATE_SEAL, GATED_REQUEST, GPU_IDS, HOLD_SEAL, INJECTED, OUTPUT_ANNOTATIONS,
                              PLACEMENT, REQUIRED_TERMS, RESERVATION, WAITING_FOR, WORKLOAD_LABEL, Injection,
                              annotations_of, at, dumps_request, recorded, seal_gate, seal_hold, waited_domain)
from ..core.model import ANNOTATION_PREFIX, EXCEEDS_NODES, GROWS_POOL, MAPPINGS, NO_MATCHING_NODES, Decision, Hold, Outcome
from ..core.strategies import Layout
from .kinds import POD, WorkloadKind
from .reconcile import annotations_in, copy_tree, put, rewrite, set_annotations
from .subject import Subject

__all__ = ["GPU_IDS", "INJECTED", "PLACEMENT", "RESERVATION", "WAITING_FOR", "WORKLOAD_LABEL", "Injection"]  # for callers
CUDA_DEVICE_ORDER = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}  # CUDA numbering = nvidia-smi/NVML numbering
# Waits that the nodes there are cannot end, only nodes added to the cluster.
WAITS_FOR_NODES = (EXCEEDS_NODES, NO_MATCHING_NODES)


def mutate(obj: Mapping, kind: WorkloadKind, decision: Decision | None, config: Config,
           reservation: str | None = None, scheduling_only: bool = False) -> dict:
    """A new object with `decision` applied to its pod template. decision None (nothing to place)
    removes what we added before and only resets our scheduler name. `scheduling_only`: an UPDATE
    that un-suspends the object, where the apiserver lets a pod template change only its node
    affinity, node selector, tolerations, scheduling gates, labels and annotations (a Job's:
    k8s.io/kubernetes pkg/apis/batch/validation, validatePodTemplateUpdate): env, spread
    constraints and the scheduler name stay as they are, or the update would be refused."""
    outputs: dict[str, str | None] = dict.fromkeys(OUTPUT_ANNOTATIONS)
    if decision is not None:
        if decision.hold is None and decision.outcome is not Outcome.NEVER:
            raise ValueError("a decision without its hold (placement/enforce.py decides it): nothing to write")
        waiting = waited_domain(decision)
        request = dumps_request(decision.request) if decision.hold is Hold.GATE else None
        outputs.update({PLACEMENT: summary(decision), GPU_IDS: format_gpu_set(decision.gpu_ids) or None,
                        RESERVATION: reservation, WAITING_FOR: waiting, GATED_REQUEST: request,
                        GATE_SEAL: seal_gate(config.seal_key, reservation, request, waiting)
                        if request and reservation and waiting else None,
                        HOLD_SEAL: _hold_seal(config.seal_key, reservation, decision)})
    def desired(_: str, meta: dict, spec: dict, previous: Injection) -> Injection:
        wanted = _desired(meta, spec, previous, kind, obj, decision, config)
        if scheduling_only:
            return dataclasses.replace(wanted, spread=previous.spread, env=previous.env, label=previous.label)
        return wanted
    return rewrite(obj, kind, desired, lambda _: outputs, None if scheduling_only else config)


def stamped(obj: dict, reservation: str, admission: str | None) -> dict:
    """`obj` (a copy `mutate` made) marked, in its own metadata, with its reservation key and the
    admission whose hold it makes (None: it makes none, but has a scale-up under that key): the
    watch reads both from the stored object (metadata alone) to tell that the apiserver stored what
    was admitted (state/holds.py), and deletes the scale-up of one it sees deleted."""
    meta = obj["metadata"] = dict(obj.get("metadata") or {})
    meta["annotations"] = {**annotations_in(meta), RESERVATION: reservation,
                           **({ADMISSION: admission} if admission else {})}
    return obj


def _hold_seal(key: bytes, reservation: str | None, decision: Decision) -> str | None:
    """HOLD_SEAL for a placement on one node with one GPU set: what the pods' holds are read from."""
    ids = format_gpu_set(decision.gpu_ids)
    if reservation is None or not ids or len(decision.held_nodes) != 1:
        return None
    return seal_hold(key, reservation, ids, decision.held_nodes[0])


def released(pod: Mapping, decision: Decision, seal_key: bytes) -> dict:
    """A gated pod (see `Hold.GATE`, placement/enforce.py) let go where `decision` places it: the decision's domain added as
    required node affinity, its GPU ids and summary written, our gate removed. Nothing else
    changes: a pod's containers are fixed at creation, and while it is gated the API allows only
    narrowing its node affinity (KEP-3838), so the pin is required even for a balanced wait."""
    expressions = confining(decision, ends=True)  # what our gate holds is a workload whose work ends

    def desired(_: str, meta: dict, spec: dict, previous: Injection) -> Injection:
        return dataclasses.replace(previous, required=(expressions,) if expressions else (), gated=False)

    reservation = annotations_of(pod).get(RESERVATION)
    outputs = {PLACEMENT: summary(decision), GPU_IDS: format_gpu_set(decision.gpu_ids) or None,
               WAITING_FOR: None, GATED_REQUEST: None, GATE_SEAL: None,
               HOLD_SEAL: _hold_seal(seal_key, str(reservation), decision) if reservation else None}
    return _gated_pod_changed(pod, rewrite(pod, POD, desired, lambda _: outputs, None), expressions, True)


def confining(decision: Decision, ends: bool) -> tuple[dict, ...]:
    """The node affinity expressions that keep a decision's pods where it was made: its domain's
    labels, and, for a placement of a workload whose work `ends`, the very nodes it holds (by
    hostname). Without these, kube-scheduler may bind a pod on another node of its domain, one held
    for another workload, which then finds no room where it was pinned (issue 59 item 9). A
    Deployment's template outlives its nodes' room (a rollout's new pods beside the old), so it is
    confined to its domain only."""
    expressions = tuple(r.expression for r in decision.requirements)
    if expressions and ends and decision.held_nodes and not any(
            r.key == HOSTNAME_LABEL for r in decision.requirements):
        expressions += ({"key": HOSTNAME_LABEL, "operator": "In", "values": list(decision.held_nodes)},)
    return expressions


def ungated(pod: Mapping) -> dict:
    """A gated pod let go with no placement (`topology-webhook ungate`, at uninstall): our gate
    lifted (only where the record says we added it), the wait's annotations dropped, so that
    kube-scheduler places it as it would without us."""
    def desired(_: str, meta: dict, spec: dict, previous: Injection) -> Injection:
        return dataclasses.replace(previous, gated=False)

    outputs = {PLACEMENT: "released from its scheduling gate without placement (topology-webhook ungate)",
               WAITING_FOR: None, GATED_REQUEST: None, GATE_SEAL: None, HOLD_SEAL: None}
    return _gated_pod_changed(pod, rewrite(pod, POD, desired, lambda _: outputs, None), (), False)


def _gated_pod_changed(pod: Mapping, rewritten: Mapping, expressions: tuple[dict, ...], lift: bool) -> dict:
    """`pod` with only what may change on a gated pod taken from `rewritten`: its scheduling
    gates (our gate removed whatever the record says, when `lift`), `expressions` added to every
    required nodeSelectorTerm (never one removed: the API lets a gated pod's affinity only narrow)
    and our annotations. The record on a pod is its owner's to edit: a record claiming env or
    expressions we never added must not make the release patch touch containers or widen the
    affinity, which the apiserver (and the chart's policy) refuses, stranding the release."""
    out = copy_tree(dict(pod))
    spec, new_spec = out.setdefault("spec", {}), rewritten.get("spec") or {}
    gates = [g for g in new_spec.get("schedulingGates") or () if not (lift and isinstance(g, dict)
                                                                     and g.get("name") == GATE)]
    put(spec, ("schedulingGates",), gates)
    if expressions:
        terms = [term if isinstance(term, dict) else {} for term in at(spec, REQUIRED_TERMS) or [{}]]
        for term in terms:
            if term or len(terms) == 1:  # an empty term {} among others matches no node: it stays empty
                present = term.get("matchExpressions") or []
                term["matchExpressions"] = [*present, *(e for e in expressions if e not in present)]
        put(spec, REQUIRED_TERMS, terms)
    meta = out.setdefault("metadata", {})
    ours = {k: v for k, v in annotations_in(rewritten.get("metadata") or {}).items() if k.startswith(ANNOTATION_PREFIX)}
    set_annotations(meta, {**{k: None for k in annotations_in(meta) if k.startswith(ANNOTATION_PREFIX)}, **ours})
    return out


def carry_over(old: Subject, new: Mapping, config: Config) -> dict:
    """`new` (an UPDATE) with the placement recorded on `old` put back: an update keeps the
    placement made at creation instead of dropping it (server-side apply removes fields the
    applier owns and omits) or moving running work. Items the user now has win, as always."""
    old_templates = {found.where: found.template for found in old.templates}
    return rewrite(new, old.placed_kind, lambda where, *_: recorded(old_templates.get(where)),
                   lambda where: {key: annotations_of(old_templates.get(where)).get(key)
                                  for key in OUTPUT_ANNOTATIONS}, config)


def without_injection(subject: Subject) -> Subject:
    """The subject with our previous additions removed: the object as the user wrote it, which is
    what a workload is read from (so a re-placement is not confined by our own old pin). For
    reading only: a subject that carries nothing of ours is returned as it is, not copied."""
    if not any(key in annotations_of(found.template) for found in subject.templates for key in OUTPUT_ANNOTATIONS):
        return subject
    return subject.as_written(rewrite(subject.obj, subject.placed_kind, lambda *_: Injection(),
                                      lambda _: dict.fromkeys(OUTPUT_ANNOTATIONS), None))


def summary(decision: Decision) -> str:
    """One line for people: the `placement` annotation."""
    request = decision.request
    where = str(decision.scope) if decision.scope else "the cluster"
    size = f"{request.total_gpus} GPU(s) as {request.pods} pod(s) x {request.gpus_per_pod}"
    if decision.outcome is Outcome.WAIT and decision.code == GROWS_POOL:
        return f"waiting ({request.strategy.value}) for {where} to add nodes: {size}; no room on the nodes there are"
    if decision.outcome is Outcome.WAIT and decision.code in WAITS_FOR_NODES:
        return f"waiting ({request.strategy.value}) for nodes to be added: {size}; the nodes there are cannot hold it"
    if decision.outcome is Outcome.WAIT:
        return f"waiting ({request.strategy.value}) for {where}: {size}; no room now"
    text = f"{request.strategy.value} in {where}: {size} on {len(decision.assignment)} node(s)"
    if request.total_gpus == 1:
        return text  # one GPU talks to no one: no link or bus bandwidth to speak of
    if decision.interconnect is not None:
        text += f", over {decision.interconnect.value}"
    if decision.bus_bandwidth_gbs is not None:
        text += f", ~{decision.bus_bandwidth_gbs:.0f} GB/s all-reduce bus bandwidth (estimate"
        text += f", {decision.profile})" if decision.profile else ")"
    return text


def warnings(decision: Decision) -> tuple[str, ...]:
    """Short notes for the user about what the decision means for their job."""
    request = decision.request
    who = request.workload
    out = []
    if decision.outcome is Outcome.WAIT and decision.code in (GROWS_POOL, *WAITS_FOR_NODES):
        reason = decision.reasons[0]  # says what the nodes there are hold, and that it waits
        out.append(reason if reason.startswith(who) else f"{who}: {reason}")
    elif decision.outcome is Outcome.WAIT:
        where = str(decision.scope) if decision.scope else "the domain that fits first"
        if decision.hold is Hold.GATE:
            out.append(f"{who}: no room now for {request.total_gpus} GPUs in one domain; held by scheduling gate "
                       f"{GATE} until {where} or a domain no wider has room, then pinned there")
        elif decision.hold is Hold.PIN:
            out.append(f"{who}: no room now for {request.total_gpus} GPUs in one domain; pinned to {where}, "
                       "so it waits for locality instead of scattering")
        else:
            out.append(f"{who}: no room now for {request.total_gpus} GPUs in one domain; only preferring {where}, "
                       "so pods may start scattered over slower links")
    if decision.preferred_honoured is False:  # placement's first reason says where instead, and why
        out.append(f"{who}: {decision.reasons[0]}" if decision.reasons else
                   f"{who}: preferred domain {request.preferred_domain} not honoured")
    crowded = [a for a in decision.assignment if a.pods > 1]
    if request.pods > 1 and crowded:
        out.append(f"{who}: {crowded[0].pods} pods share node {crowded[0].node}; ranks in different pods do not "
                   "share NVLink (NCCL needs one host and /dev/shm): one pod per node with all its GPUs is faster")
    return tuple(out)


def workload_label_value(kind: str, obj: Mapping) -> str:
    """A label value (<= 63 chars, alphanumeric ends) naming the workload's pods."""
    meta = obj.get("metadata") or {}
    name = str(meta.get("name") or meta.get("generateName") or kind.lower())
    clean = re.sub(r"[^A-Za-z0-9._-]", "-", name).strip("-_.") or kind.lower()
    if len(clean) <= 63:
        return clean
    digest = hashlib.sha256(name.encode()).hexdigest()[:10]
    return clean[:52].rstrip("-_.") + "-" + digest


def _desired(meta: dict, spec: dict, previous: Injection, kind: WorkloadKind, obj: Mapping, decision: Decision | None,
             config: Config) -> Injection:
    if decision is None or decision.outcome is Outcome.NEVER:
        return Injection()
    expressions = confining(decision, ends=not kind.keeps_its_template)
    required: tuple[tuple[dict, ...], ...] = ()
    preferred = None
    # A gated wait gets neither: the releaser writes the pin where it starts it.
    if expressions and decision.hold is Hold.PIN:
        required = (expressions,)  # the same expressions for every term: reconcile.py spreads them
    elif expressions and decision.hold is Hold.PREFER:
        preferred = {"weight": config.preferred_weight, "preference": {"matchExpressions": list(expressions)}}
    label = None
    spread: tuple[dict, ...] = ()
    if decision.request.strategy.rules.layout is Layout.SPREAD and decision.spread_keys:
        current = (meta.get("labels") or {}).get(WORKLOAD_LABEL)
        users = current is not None and current != previous.label  # then the selector uses theirs
        value = current if users else workload_label_value(kind.name, obj)
        label = None if users else value
        # One pod per node is the point, unless the decision already had to stack pods; across
        # wider domains, balance without blocking.
        one_per_node = all(a.pods <= 1 for a in decision.assignment)
        spread = tuple({"maxSkew": 1, "topologyKey": key,
                        "whenUnsatisfiable": "DoNotSchedule" if key == HOSTNAME_LABEL and one_per_node
                        else "ScheduleAnyway",
                        "labelSelector": {"matchLabels": {WORKLOAD_LABEL: value}}}
                       for key in decision.spread_keys)
    link = decision.interconnect
    profile = dict(config.nccl_profiles.get(link.value, {})) if link and decision.request.total_gpus > 1 else {}
    profile.update(CUDA_DEVICE_ORDER)
    profile = dict(sorted(profile.items()))  # the record keeps names sorted: so does the container
    env = {c["name"]: profile for c in _ranks_containers(spec)}
    return Injection(required, preferred, spread, env, label, decision.hold is Hold.GATE)


def _ranks_containers(spec: Mapping) -> list[dict]:
    """The containers where the job's ranks run on the pod's GPUs: app containers and sidecars (init
    containers with restartPolicy Always) asking nvidia.com/gpu, else (GPUs asked through Dynamic
    Resource Allocation) those that use one of the pod's claims. NCCL reads its environment when
    ranks that run together form a communicator; an init container of any other kind runs alone
    and to completion before the app containers start, so it is never one of them."""
    found = [c for c in spec.get("initContainers") or () if isinstance(c, dict) and c.get("restartPolicy") == "Always"]
    found += [c for c in spec.get("containers") or () if isinstance(c, dict)]
    by_limits = [c for c in found if container_gpus(c) > 0]
    if by_limits:
        return by_limits
    return [c for c in found if isinstance(c.get("resources"), MAPPINGS) and c["resources"].get("claims")]
