"""Values that flow between the steps: what a workload asks for, and what placement decided.

Every type here is a frozen dataclass or an enum from the standard library, so any module
may import this one and none of them can change a value another step handed over.
"""
from __future__ import annotations

import dataclasses

import collections.abc
import enum
from dataclasses import dataclass, field
from typing import Mapping

from .strategies import DEFAULT as DEFAULT_STRATEGY, Strategy  # what each strategy does: registered there

ANNOTATION_PREFIX = "topology.scheduler/"
GPU_RESOURCE = "nvidia.com/gpu"
# `isinstance(value, MAPPINGS)`: any mapping, with a decoded JSON object (a dict) taken before the
# abstract class's check, which costs three times as much (the review path makes about 60 a review).
MAPPINGS = (dict, collections.abc.Mapping)


class Outcome(str, enum.Enum):
    """What callers can do with a decision; each value is a distinct next step."""

    PLACED = "placed"  # a domain has room now: pin or prefer it
    WAIT = "wait"  # not now: pin where it will fit first, or only prefer; or wait for nodes to be added
    NEVER = "never"  # no amount of waiting or growing helps (or refuse_unplaceable): deny


class Hold(str, enum.Enum):
    """How a decision keeps its workload to the domain it names: what the mutation writes."""

    PIN = "pin"  # required node affinity: the scheduler may use no other node
    PREFER = "prefer"  # preferred node affinity: the scheduler may spill it elsewhere
    GATE = "gate"  # our scheduling gate, until the releaser pins it where it starts


# Why a decision did not place, as stable codes that callers and tests compare against.
NO_ROOM_NOW = "NoRoomNow"  # WAIT: the topology could hold it once running work finishes
# WAIT (NEVER with refuse_unplaceable): nodeSelector/affinity/taints/bandwidth leave no GPU node now
NO_MATCHING_NODES = "NoMatchingNodes"
EXCEEDS_NODES = "ExceedsNodes"  # WAIT (NEVER with refuse_unplaceable): the nodes there are hold too few, even idle
GROWS_POOL = "GrowsPool"  # WAIT: steered to a pool that can add nodes for it (the nodes there are have no room)
EXCEEDS_CLUSTER = "ExceedsCluster"  # NEVER: a pod larger than any node (or growable pool) it may use
UNKNOWN_DOMAIN = "UnknownPreferredDomain"  # NEVER: preferred-domain names no domain
UNKNOWN_LEVEL = "UnknownMaxDomain"  # NEVER: max-domain names no level
EXCEEDS_MAX_DOMAIN = "ExceedsMaxDomain"  # NEVER: no domain of the max-domain level could ever hold it
GROUP_MISMATCH = "GroupSizeMismatch"  # NEVER: a group member's size differs from the one its group was decided for


class Interconnect(str, enum.Enum):
    """The slowest link the workload's collective traffic crosses, narrowest first."""

    NVLINK = "nvlink"  # one NVLink/NVSwitch domain (inside a node, or a multi-node NVLink fabric)
    PCIE = "pcie"  # one node, across NVLink domains or with no NVLink at all
    NODE = "node"  # several pods on one node: NCCL sees separate hosts and goes through the NIC
    LEAF = "leaf"  # several nodes under one leaf switch
    SPINE = "spine"  # several leaves under one spine
    ZONE = "zone"  # several spines in one zone
    CLUSTER = "cluster"  # several zones

    @property
    def rank(self) -> int:
        return list(Interconnect).index(self)


@dataclass(frozen=True)
class PlacementRequest:
    """One workload's request, validated: what the placement core needs and nothing else."""

    workload: str  # "Job ml/train" or "Pod ml/trainer-" (generateName): used in reasons only
    pods: int
    gpus_per_pod: int
    strategy: Strategy = DEFAULT_STRATEGY
    latency_sensitive: bool = False
    preferred_domain: str | None = None  # a label value, or LEVEL=VALUE
    # A domain's path a consolidated or balanced placement searches before the rest, silently: the
    # GPUs this replica claimed ahead for its next placements (webhook/kube/allotment.py), so that
    # they need no write. Unlike preferred_domain it is nobody's wish: no reason mentions it, and a
    # distributed spread, a wait and a preferred domain ignore it.
    search_first: tuple[tuple[str, str], ...] | None = None
    max_domain: str | None = None  # a level (name or label key) the placement may never be wider than
    min_bandwidth_gbps: float | None = None  # Gb/s, compared with the node label network-bandwidth
    node_selector: Mapping[str, str] = field(default_factory=dict)
    required_node_terms: tuple[Mapping, ...] = ()  # nodeSelectorTerms, ORed, as in the pod spec
    tolerations: tuple[Mapping, ...] = ()
    # What each pod takes of the node's other resources, sorted (name, amount): cpu in
    # millicores, memory in bytes, pods 1... (resources.py). Empty: GPUs only.
    resources: tuple[tuple[str, int], ...] = ()
    # Whether a balanced wait may be pinned where waiting pays: not when the user asked only for a
    # preference (preferred-domain, a peer's preferred topology), nor for a workload that keeps its
    # pod template for good (a Deployment, StatefulSet, CronJob...), where the pin would outlive the wait.
    may_pin_wait: bool = True
    # How long its pods have waited in a pinned or gated wait, by the index's clock (placer.place_gated
    # sets it when it decides a wait again): what ages a wait for a narrower domain (tight_wait_seconds).
    waited_seconds: float = 0.0

    @property
    def total_gpus(self) -> int:
        return self.pods * self.gpus_per_pod


@dataclass(frozen=True)
class DomainRef:
    """A topology domain: the label values from the widest level down to its own."""

    level: int  # index into the configured levels; len(levels) is the node level, -1 the cluster
    level_name: str  # "leaf", "spine", "node", "cluster"...
    path: tuple[tuple[str, str], ...]  # ((label key, value), ...) widest first; () for the cluster

    @property
    def name(self) -> str:
        if not self.path:
            return "cluster"
        return self.path[-1][1] or f"(no {self.path[-1][0]} label)"

    def __str__(self) -> str:
        return f"{self.level_name} {self.name}" if self.path else "the whole cluster"


@dataclass(frozen=True)
class NodeAssignment:
    """Pods the decision counts on one node, and the NVLink-aligned GPU set of each pod."""

    node: str
    pods: int
    gpu_ids: tuple[tuple[int, ...], ...]  # one tuple of host GPU indices per pod
    interconnect: Interconnect  # inside one pod: NVLINK when its set shares a domain, else PCIE


@dataclass(frozen=True)
class NodeRequirement:
    """One matchExpression the mutation pins or prefers: `key In values`, or, with no values,
    `key DoesNotExist` (a domain whose nodes lack that level's label)."""

    key: str
    values: tuple[str, ...]

    @property
    def expression(self) -> dict:
        if not self.values:
            return {"key": self.key, "operator": "DoesNotExist"}
        return {"key": self.key, "operator": "In", "values": list(self.values)}


@dataclass(frozen=True)
class Decision:
    """A placement decision and why. Pure data: the mutation step turns it into pod-spec changes."""

    outcome: Outcome
    request: PlacementRequest
    scope: DomainRef | None  # the single domain that holds the whole workload (nearest common parent)
    domains: tuple[DomainRef, ...] = ()  # the domains used one level below the scope (the span)
    assignment: tuple[NodeAssignment, ...] = ()  # empty unless PLACED
    requirements: tuple[NodeRequirement, ...] = ()  # node affinity that confines pods to the choice
    # PLACED: the nodes it holds, by their hostname label (none past a few hundred): pods whose work
    # ends are confined to exactly these, so that none lands on a node held for another workload
    held_nodes: tuple[str, ...] = ()
    spread_keys: tuple[str, ...] = ()  # topology keys to spread pods over (distributed)
    interconnect: Interconnect | None = None
    bus_bandwidth_gbs: float | None = None  # estimated all-reduce bus bandwidth, GB/s
    profile: str | None = None  # hardware profile the estimate used
    preferred_honoured: bool | None = None  # None when no preferred domain was asked for
    # A wait only: whether waiting inside `scope` buys bandwidth (the cost model gives less in any
    # wider domain). False: the job runs as fast on any node, so its wait only prefers `scope`.
    locality_pays: bool = True
    code: str | None = None  # one of the reason codes above when the outcome is not PLACED
    reasons: tuple[str, ...] = ()  # short sentences for people, most important first
    # How it is kept there (enforce.py, from the settings); None while undecided, and for NEVER.
    hold: Hold | None = None

    @property
    def gpu_ids(self) -> tuple[int, ...]:
        """The GPU set every pod gets: a single pod's, or the one set all pods of a template share
        (whole nodes: 0-7 on each); empty when they differ (pods of a template share one spec)."""
        sets = {gpus for assigned in self.assignment for gpus in assigned.gpu_ids}
        return next(iter(sets)) if len(sets) == 1 else ()

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(a.node for a in self.assignment)


def quoted(value: object) -> str:
    """A user's bad value in our message, shortened so the message stays one readable line: text
    in double quotes, anything else as Python writes it (None, 8, [1]), so a missing value never
    reads like the text "None"."""
    text = str(value).replace("\n", " ") if isinstance(value, str) else repr(value)
    text = text if len(text) <= 40 else text[:37] + "..."
    return f'"{text}"' if isinstance(value, str) else text


def on_nodes(request: PlacementRequest, nodes: list[str]) -> PlacementRequest:
    """The request confined to `nodes` (by name, in every ORed term of its own affinity)."""
    by_name = {"key": "metadata.name", "operator": "In", "values": nodes}
    terms = request.required_node_terms or ({},)
    confined = tuple({**term, "matchFields": [*(term.get("matchFields") or ()), by_name]} for term in terms)
    return dataclasses.replace(request, required_node_terms=confined)
