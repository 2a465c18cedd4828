"""The index's GPUs from DRA: which source a node's GPUs are counted from, and the DRA facts
(dra.py) applied to the nodes they change, no others."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Protocol

from ..core.model import GPU_RESOURCE
from . import dra
from .members import NodeInfo, NodeState, placement_fields, with_gpus


@dataclass(frozen=True, slots=True)
class DraFact:
    """A DRA object (or PodGroup, or ComputeDomain) of `kind`, by its key, added or changed, or
    deleted (`facts` None). Its facts by kind: SliceFacts (None: another driver's slice),
    ClaimFacts, TemplateFacts, whether a DeviceClass selects whole GPUs, PodGroupFacts, and a
    ComputeDomain's channel template key (None: it names none)."""

    kind: str
    key: str
    facts: object


class Nodes(Protocol):
    """What the DRA part asks of the index around it (state/index.py)."""

    def node(self, name: str) -> NodeState | None: ...
    def install(self, old: NodeState, fresh: NodeState) -> None: ...  # in place of `old`, keeping its pods
    def set_claimed(self, node: NodeState, claimed: frozenset[int]) -> None: ...
    def count_through_claim(self, pod: str) -> None: ...  # the pod's GPUs are now counted from its claim


class Devices:
    def __init__(self, nodes: Nodes) -> None:
        self.nodes = nodes
        self.inventory = dra.DraInventory()
        self.both_sources: set[str] = set()  # nodes with allocatable nvidia.com/gpu and DRA GPUs

    def counted(self, info: NodeInfo) -> tuple[NodeInfo, frozenset[int]]:
        """The node's facts with the GPUs it is counted with: allocatable nvidia.com/gpu when it
        has any (the device plugin), else its GPU devices in ResourceSlices, never both; and
        which of them claims hold."""
        gpus = self.inventory.node_gpus(info.name)
        if info.plugin_gpus and gpus:
            self.both_sources.add(info.name)
        else:
            self.both_sources.discard(info.name)
        if info.plugin_gpus or not gpus:
            same = info.gpus == info.plugin_gpus and not info.devices
            return (info if same else with_gpus(info, info.plugin_gpus)), frozenset()
        return with_gpus(info, sum(len(names) for _, names in gpus), gpus), self.inventory.claimed(info.name, gpus)

    def apply(self, fact: DraFact) -> None:
        """The nodes whose GPUs or GPUs in use the fact changes are recounted, no others."""
        inventory, facts = self.inventory, fact.facts
        if fact.kind == "ResourceSlice":
            assert facts is None or isinstance(facts, dra.SliceFacts)
            self._recount(inventory.put_slice(fact.key, facts))
        elif fact.kind == "ResourceClaim":
            assert facts is None or isinstance(facts, dra.ClaimFacts)
            self._recount(inventory.put_claim(fact.key, facts))
            if facts is not None and facts.scheduler_made_for is not None:
                self.nodes.count_through_claim(facts.scheduler_made_for)
        elif fact.kind == "ComputeDomain":
            assert facts is None or isinstance(facts, str)
            inventory.put_compute_domain(fact.key, facts)
        else:
            tables: dict[str, dict] = {"ResourceClaimTemplate": inventory.templates, "DeviceClass": inventory.classes,
                                       "PodGroup": inventory.pod_groups}
            table = tables[fact.kind]
            if facts is not None:
                table[fact.key] = facts
            else:
                table.pop(fact.key, None)

    def _recount(self, names: Iterable[str]) -> None:
        for name in names:
            node = self.nodes.node(name)
            if node is None:
                continue
            counted, claimed = self.counted(node.info)
            if placement_fields(counted) != placement_fields(node.info):
                self.nodes.install(node, NodeState(counted, claimed=set(claimed)))
            elif claimed != node.claimed:
                self.nodes.set_claimed(node, claimed)

    def keys(self, kind: str) -> set[str]:
        """Keys of the DRA objects of `kind` held (a relist forgets the others)."""
        inventory = self.inventory
        tables: dict[str, dict] = {
            "ResourceSlice": inventory.slices, "ResourceClaim": inventory.claims,
            "ResourceClaimTemplate": inventory.templates, "DeviceClass": inventory.classes,
            "PodGroup": inventory.pod_groups, "ComputeDomain": inventory.compute_domains}
        return set(tables[kind])

    def warnings(self) -> list[str]:
        """What the GPU count per node cannot be sure of now, for people."""
        both = [f"node {name} has allocatable {GPU_RESOURCE} and GPU devices in ResourceSlices; its GPUs "
                "are counted once, from allocatable" for name in sorted(self.both_sources)]
        return [*(self.inventory.incomplete[pool] for pool in sorted(self.inventory.incomplete)), *both]
