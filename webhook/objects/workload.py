"""Read a workload (Pod, Job, Deployment, StatefulSet, ReplicaSet, CronJob) into a PlacementRequest.

Pure: takes the object as a Subject (webhook/objects/subject.py: its pod templates found once,
its shape checked once) and returns values. How many GPUs a workload wants:

- `per_pod` is what the pod template's containers ask for (`nvidia.com/gpu` limits, counted the
  way kube-scheduler counts them) plus the GPUs of its `resourceClaims` (Dynamic Resource
  Allocation: the ResourceClaimTemplates and ResourceClaims they name, as the cluster view knows
  them, webhook/state/dra.py), `replicas` the pods the controller runs at once (Job and
  CronJob: parallelism, default 1, capped by completions; Deployment, StatefulSet, ReplicaSet:
  replicas, default 1; Pod: 1).
- Without `gpu-count`: pods = replicas, each with per_pod GPUs.
- `gpu-count` G is the workload's total. If G = per_pod x replicas, all agree. Otherwise:
  a Pod holds exactly what its containers ask, so per_pod wins; for controllers, G wins when it
  divides by per_pod (pods = G / per_pod: gpu-count sizes the gang) and the containers win when it
  does not. If the containers ask for no GPUs, G is spread evenly over the replicas (it must
  divide). Every disagreement is reported in a warning.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from ..core.gpus import pod_gpus
from ..core.model import MAPPINGS, PlacementRequest, on_nodes, quoted
from ..core.resources import pod_requests
from ..state.dra import CLIQUE_LABEL, ClaimDemand, ClaimRefs, PodGroupFacts
from .dra_objects import claim_refs, pod_group_of
from . import groups
from . import user_annotations as asked
from .groups import GROUP_SIZE, Membership
from .subject import Subject
from .templates import PodTemplate, field_path, mapping_of
from .user_annotations import (GPU_COUNT, LATENCY_SENSITIVE, MAX_DOMAIN, NETWORK_BANDWIDTH, PEER_PREFERRED,
                               PEER_REQUIRED, PREFERRED_DOMAIN, STRATEGY, InvalidAnnotation, InvalidWorkload)


@dataclass(frozen=True)
class Workload:
    """What one object asks for. `request` is None when there is nothing to place, and `idle`
    says why ("runs no pods now (spec.replicas: 0)", "requests no nvidia.com/gpu")."""

    request: PlacementRequest | None
    warnings: tuple[str, ...] = ()
    idle: str = ""
    group: Membership | None = None  # a Pod placed as a member of this group (request: the whole group's)
    unknown: tuple[str, ...] = ()  # claim templates or claims it names that are not known: not placed


class ClusterFacts(Protocol):
    """What a workload's request depends on besides the object itself: the cluster view's DRA
    objects and PodGroups (webhook/state/index.py)."""

    def claims_demand(self, namespace: str, claims: ClaimRefs) -> ClaimDemand: ...  # GPUs of its resourceClaims
    def pod_group(self, key: str) -> PodGroupFacts | None: ...  # a PodGroup, by namespace/name
    def has_level(self, label: str) -> bool: ...  # a topology level is labelled so


def read(subject: Subject, facts: ClusterFacts | None = None) -> Workload:
    """The validated request of one object of ours, read from its pod templates as found (its
    shape is checked unless it was already). Raises InvalidWorkload (or InvalidAnnotation).
    `facts` gives GPU demand from resourceClaims and PodGroups; without them only nvidia.com/gpu
    counts, and a PodGroup is sized by annotations only."""
    subject.check_shape()
    kind, namespace, who = subject.kind, subject.namespace, subject.who
    annotations = subject.annotations
    pod_group = _pod_group(subject, facts)
    if pod_group is not None:  # what the PodGroup asks for, where its pods say nothing
        annotations = {**pod_group.annotations, **annotations}

    def demand_of(spec: Mapping) -> ClaimDemand:
        demand = facts.claims_demand(namespace, claim_refs(spec)) if facts is not None and spec.get("resourceClaims") \
            else ClaimDemand()
        if demand.bad_counts:  # the API refuses such a claim: never placed as a guess
            raise InvalidWorkload(f"{who}: asks for devices through {demand.bad_counts[0]} is not allowed; "
                                  "allowed: a whole number >= 1")
        return demand

    template, per_pod, running, count_field = _pods(subject, lambda spec: demand_of(spec).per_pod)
    if pod_group is not None and pod_group.min_count is not None:
        running = pod_group.min_count  # a gang's pods run at once, sharing its claims
    spec = template["spec"]
    demand = demand_of(spec)
    if demand.unknown:
        return Workload(None, (f"{who}: asks for devices through {', '.join(demand.unknown)}, not known to the "
                               "webhook yet, so how many GPUs it needs is unknown and it is admitted without "
                               "placement (create the template before the workload)",), "", unknown=demand.unknown)
    own_gpus = per_pod
    per_pod, running, shared_warnings = _with_shared_claims(who, per_pod, running, demand)
    if demand.channel is not None and facts is not None:
        annotations, channel_warnings = _in_one_clique(who, demand.channel, annotations, facts)
        shared_warnings += channel_warnings
    group = subject.membership(annotations) if per_pod else None
    if group is None and per_pod and kind == "Pod" and demand.channel is not None:
        group = groups.channel_membership(namespace, demand.channel, annotations)
    if group is None and kind == "Pod" and demand.shared and not own_gpus:
        group = groups.claim_membership(namespace, demand.shared[0][0])  # pods naming it share one decision
    if group is not None and pod_group is not None and pod_group.min_count is not None:
        group = dataclasses.replace(group, size=running)  # the gang's size wins; 1 when placed as the set it shares
    if group is not None:
        group, pods, gpus_per_pod, warnings = _group_size(who, group, per_pod, annotations.get(GPU_COUNT))
    else:
        pods, gpus_per_pod, warnings = _size(kind, who, per_pod, running, annotations.get(GPU_COUNT))
    warnings = asked.unknown_annotations(who, annotations) + shared_warnings + warnings
    if pods == 0 or gpus_per_pod == 0:
        idle = (f"runs no pods now ({count_field}: 0), so nothing to place until it "
                "is scaled up" if running == 0 else "requests no nvidia.com/gpu; nothing to place")
        return Workload(None, tuple(warnings), idle)
    request = PlacementRequest(
        workload=group.name if group is not None else who,
        pods=pods,
        gpus_per_pod=gpus_per_pod,
        strategy=asked.strategy(who, annotations.get(STRATEGY, asked.peer_strategy(annotations))),
        latency_sensitive=asked.boolean(who, LATENCY_SENSITIVE, annotations.get(LATENCY_SENSITIVE)),
        preferred_domain=asked.preferred_domain(who, annotations.get(PREFERRED_DOMAIN)),
        max_domain=asked.max_domain(who, annotations),
        min_bandwidth_gbps=asked.bandwidth(who, annotations.get(NETWORK_BANDWIDTH)),
        node_selector={str(k): str(v) for k, v in mapping_of(spec.get("nodeSelector")).items()},
        required_node_terms=_required_terms(who, spec),
        tolerations=tuple(t for t in spec.get("tolerations") or () if isinstance(t, MAPPINGS)),
        resources=tuple(sorted(pod_requests(spec).items())),
        may_pin_wait=(not subject.placed_kind.keeps_its_template and PREFERRED_DOMAIN not in annotations
                      and not any(key in annotations for key in PEER_PREFERRED)),
    )
    if demand.pinned:  # an allocated claim's devices are on its node: its pods can run nowhere else
        request = on_nodes(request, list(demand.pinned))
    return Workload(request, tuple(warnings), group=group)


def _with_shared_claims(who: str, per_pod: int, running: int, demand: ClaimDemand) -> tuple[int, int, list[str]]:
    """(GPUs per pod, pods, warnings) with the GPUs of claims its pods share: named claims not yet
    allocated, and its PodGroup's claims from templates. Each is one set of GPUs on one node
    however many pods name it, counted once. A workload whose pods have no GPUs of their own is
    placed as that one set: its pods all run on the node it goes to."""
    shared = sum(gpus for _, gpus in demand.shared + demand.group_shared)
    if not shared:
        return per_pod, running, []
    if running <= 1:
        return per_pod + shared, running, []
    names = ", ".join([f"ResourceClaim {name}" for name, _ in demand.shared] + [w for w, _ in demand.group_shared])
    if not per_pod:
        return shared, 1, [f"{who}: its {running} pods share {names}: placed as its {shared} GPUs "
                           "on one node, where all of them run"]
    return per_pod, running, [f"{who}: its {running} pods share {names} ({shared} GPUs, allocated "
                              "once wherever the first pod is scheduled); those GPUs are not placed"]


def _in_one_clique(who: str, channel: str, annotations: Mapping[str, str], facts: ClusterFacts
                   ) -> tuple[Mapping[str, str], list[str]]:
    """A workload sharing a ComputeDomain's channel never spans NVLink domains: max-domain is the
    clique level, unless it asks for a level itself."""
    if any(key in annotations for key in (MAX_DOMAIN, *PEER_REQUIRED)):
        return annotations, []
    if not facts.has_level(CLIQUE_LABEL):
        return annotations, [f"{who}: shares ComputeDomain channel {channel}, but no topology level is labelled "
                             f"{CLIQUE_LABEL}, so it is not kept inside one NVLink domain (use levels: nvl72)"]
    return {**annotations, MAX_DOMAIN: CLIQUE_LABEL}, []


def _pod_group(subject: Subject, facts: ClusterFacts | None) -> PodGroupFacts | None:
    """The PodGroup a Pod names, as the cluster view knows it."""
    name = pod_group_of(mapping_of(subject.obj.get("spec"))) if subject.kind == "Pod" else None
    return facts.pod_group(f"{subject.namespace}/{name}") if name and facts is not None else None


def _group_size(who: str, group: Membership, per_pod: int, gpu_count: object
                ) -> tuple[Membership | None, int, int, list[str]]:
    """(group, pods, GPUs per pod, warnings) of a whole group, from one member that asks for
    `per_pod` GPUs; when nothing says the group's size, the pod is placed on its own (group None)."""
    if group.size is not None:
        warnings = []
        if gpu_count is not None and asked.gpu_count(who, gpu_count) != group.size * per_pod:
            warnings.append(f"{who}: {GPU_COUNT}={asked.gpu_count(who, gpu_count)} disagrees with {group.size} pods x "
                            f"{per_pod} GPUs of {group.name}; the group's size wins")
        return group, group.size, per_pod, warnings
    if gpu_count is None:
        return None, 1, per_pod, [f"{who}: the size of {group.name} is not known, so this pod is placed on its own; "
                                  f"allowed: annotation {GROUP_SIZE} (pods) or {GPU_COUNT} (the group's GPUs)"]
    total = asked.gpu_count(who, gpu_count)
    if total % per_pod:
        raise InvalidAnnotation(f"{who}: annotation {GPU_COUNT}={total} (the GPUs of all of {group.name}) does not "
                                f"divide by the {per_pod} GPUs of this pod; allowed: a multiple of {per_pod}, or "
                                f"annotation {GROUP_SIZE}")
    return group, total // per_pod, per_pod, []


def _pods(subject: Subject, claimed: Callable[[Mapping], int]) -> tuple[Mapping, int, int, str]:
    """(the template placement reads, GPUs per pod, pods the controllers run at once, the field
    that counts them). A pod's GPUs are its nvidia.com/gpu and what its claims from templates ask
    (`claimed`). Templates whose pods ask for no GPUs (an MPIJob's launcher, a Ray head) are
    not counted when others ask for GPUs: they run inside the group's domain, holding none."""
    who = subject.who
    counted: list[tuple[Mapping, int, int, str]] = []
    for found in subject.templates:
        template = found.template
        if template is None or not isinstance(template.get("spec"), MAPPINGS):
            raise InvalidWorkload(f"{who}: {field_path(found.where, 'spec')} is missing; a pod spec with containers is "
                                  "required to place it")
        claims = claimed(template["spec"])  # raises InvalidWorkload itself
        try:
            gpus = pod_gpus(template["spec"]) + claims
        except ValueError as err:
            raise InvalidWorkload(f"{who}: nvidia.com/gpu request {err}; allowed: a whole number of GPUs") from None
        counted.append((template, gpus, *_running(found, who)))
    if not counted:
        raise InvalidWorkload(f"{who}: no pod template found; a pod spec with containers is required to place it")
    with_gpus = [entry for entry in counted if entry[1]] or counted
    per_pod = max(gpus for _, gpus, _, _ in with_gpus)
    return (with_gpus[0][0], per_pod, sum(pods for _, _, pods, _ in with_gpus),
            " + ".join(field for _, _, _, field in with_gpus))


def _running(found: PodTemplate, who: str) -> tuple[int, str]:
    """Pods one template runs at once (an absent or null count takes the API's default, 1), and
    the field that says so."""
    pods, field = 1, found.replica_where or "spec"
    for name in found.spec_of.counts:
        field = field_path(found.replica_where, name)
        pods *= _count(found.replica_spec.get(name), who, field)
    if found.spec_of.job is not None:
        job_where = found.replica_where
        job: Any = found.replica_spec
        for key in found.spec_of.job:
            job, job_where = mapping_of(job).get(key), field_path(job_where, key)
        job = mapping_of(job)
        field = field_path(job_where, "parallelism")
        parallelism = _count(job.get("parallelism"), who, field)
        if job.get("completions") is not None:
            parallelism = min(parallelism, _count(job["completions"], who, field_path(job_where, "completions")))
        pods *= parallelism
    return pods, field


def _size(kind: str, who: str, per_pod: int, running: int, gpu_count: object) -> tuple[int, int, list[str]]:
    """(pods, GPUs per pod, warnings) by the rule in the module docstring."""
    if gpu_count is None:
        return running, per_pod, []
    total = asked.gpu_count(who, gpu_count)
    derived = per_pod * running
    if total == derived:
        return running, per_pod, []
    if running == 0:
        return 0, per_pod, [f"{who}: runs no pods (0 replicas), so {GPU_COUNT}={total} places nothing now"]
    if per_pod == 0:
        if total % running:
            raise InvalidAnnotation(f"{who}: annotation {GPU_COUNT}={total!s} does not divide over {running} pods; "
                                    f"allowed: a multiple of {running}, or nvidia.com/gpu limits on the containers")
        return running, total // running, [f"{who}: containers request no nvidia.com/gpu; placing {total} GPUs "
                                           f"from {GPU_COUNT}, but pods only get GPUs their containers request"]
    said = f"{GPU_COUNT}={total} disagrees with {per_pod} GPUs x {running} pods = {derived}"
    if kind == "Pod":
        return 1, per_pod, [f"{who}: {said}; a Pod holds what its containers request, placing {per_pod} GPUs"]
    if total % per_pod == 0:
        return total // per_pod, per_pod, [f"{who}: {said}; {GPU_COUNT} wins: placing {total // per_pod} pods "
                                           f"of {per_pod} GPUs (make replicas/parallelism match)"]
    return running, per_pod, [f"{who}: {said}; it does not divide by {per_pod}, so the containers win: "
                              f"placing {derived} GPUs"]


def _required_terms(who: str, spec: Mapping) -> tuple[Mapping, ...]:
    """The required nodeSelectorTerms that can match a node. Kubernetes reads an empty term `{}`
    as matching no node, so it adds nothing to the ORed terms; when every term is empty the pod
    can never be scheduled, which is denied here rather than placed."""
    node_affinity = mapping_of(mapping_of(spec.get("affinity")).get("nodeAffinity"))
    required = mapping_of(node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution"))
    terms = [t for t in required.get("nodeSelectorTerms") or () if isinstance(t, MAPPINGS)]
    matching = tuple(t for t in terms if t.get("matchExpressions") or t.get("matchFields"))
    if terms and not matching:
        raise InvalidWorkload(f"{who}: every required nodeSelectorTerm is empty, and an empty term matches no "
                              "node, so no node can run it; allowed: terms with matchExpressions or matchFields")
    return matching


def _count(value: object, who: str, field: str) -> int:
    if value is None:
        return 1
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidWorkload(f"{who}: {field}={quoted(value)} is not allowed; allowed: a whole number >= 0")
    return value

