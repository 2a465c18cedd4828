"""What a workload may use: node constraints, and the constrained subsets that hold just those nodes.

Node constraints are the workload's nodeSelector, required node affinity, tolerations of taints,
`network-bandwidth`, and whether its pods fit the node's other resources (resources.py). Inverted
indexes over GPU nodes (labels, taints, bandwidth, resources) answer "does this request leave any
node out?" without visiting nodes, which is the common case: then the whole tree is used. Otherwise
the request gets a constrained subset: a tree of just its nodes, built once per distinct set of
constraints and then kept exact on every event (a changed node moves in or out; pod and hold
changes shift its aggregates), never cleared wholesale.
"""
from __future__ import annotations

import dataclasses
import heapq
from collections import OrderedDict
from typing import Callable, Iterable, Iterator, Mapping, Sequence

import orjson

from ..core.model import PlacementRequest
from .tree import NodeState, TopologyTree

MAX_SUBSETS = 32
MAX_NAMED_SUBSETS = 4


def tolerates(tolerations: Iterable[Mapping], taint: tuple[str, str, str]) -> bool:
    key, value, effect = taint
    for tol in tolerations:
        if tol.get("effect") and tol.get("effect") != effect:
            continue
        if tol.get("operator") == "Exists":
            if not tol.get("key") or tol.get("key") == key:
                return True
        elif tol.get("key") == key and (tol.get("value") or "") == value:
            return True
    return False


def expression_matches(expr: Mapping, labels: Mapping[str, str]) -> bool:
    key, op = str(expr.get("key") or ""), expr.get("operator")
    values: Sequence = expr.get("values") or ()
    if op == "In":
        return labels.get(key) in values
    if op == "NotIn":
        return labels.get(key) not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    if op in ("Gt", "Lt"):
        try:
            have, want = int(labels[key]), int(values[0])
        except (KeyError, ValueError, IndexError):
            return False
        return have > want if op == "Gt" else have < want
    return False


def node_matches(node: NodeState, request: PlacementRequest) -> bool:
    """The workload's own constraints: nodeSelector, required node affinity, taints, bandwidth."""
    if any(node.labels.get(k) != v for k, v in request.node_selector.items()):
        return False
    if request.required_node_terms:
        fields = {"metadata.name": node.name}
        if not any(all(expression_matches(e, node.labels) for e in term.get("matchExpressions") or ())
                   and all(expression_matches(e, fields) for e in term.get("matchFields") or ())
                   for term in request.required_node_terms):
            return False
    if any(not tolerates(request.tolerations, t) for t in node.taints):
        return False
    if request.min_bandwidth_gbps and (node.bandwidth_gbps or 0) < request.min_bandwidth_gbps:
        return False
    # A pod the node cannot hold even when idle; one that does not fit now only has to wait.
    return all(node.other_allocatable.get(name, 0) >= amount for name, amount in request.resources)


class NodeFilters:
    """Inverted indexes over GPU nodes, to judge a request's node constraints without a scan."""

    def __init__(self) -> None:
        self.gpu_nodes = 0
        self.taint_counts: dict[tuple[str, str, str], int] = {}
        self.by_label: dict[tuple[str, str], set[str]] = {}  # (key, value) -> node names
        self.key_counts: dict[str, int] = {}
        self.bandwidth_counts: dict[float, int] = {}  # advertised Gb/s (0 = none) -> nodes
        self.resource_nodes: dict[str, int] = {}  # resource -> GPU nodes declaring it
        # Per resource, (headroom / free GPUs, node) of nodes with free GPUs, lowest first, entries
        # checked against the node when read: whether any node's other resources run out before
        # its GPUs, answered without visiting nodes.
        self.headroom_per_gpu: dict[str, list[tuple[float, str]]] = {}
        self._headroom_changed: set[str] = set()  # nodes to note in those heaps before the next read

    def note_headroom(self, name: str) -> None:
        """The node's free GPUs or what its pods request changed: read it again before the next answer."""
        self._headroom_changed.add(name)

    def count(self, node: NodeState, sign: int) -> None:
        if node.gpus <= 0:
            return
        self.gpu_nodes += sign
        for item in node.labels.items():
            names = self.by_label.setdefault(item, set())
            (names.add if sign > 0 else names.discard)(node.name)
            if not names:
                del self.by_label[item]
            self.key_counts[item[0]] = self.key_counts.get(item[0], 0) + sign
        for taint in node.taints:
            self.taint_counts[taint] = self.taint_counts.get(taint, 0) + sign
        bandwidth = node.bandwidth_gbps or 0.0
        self.bandwidth_counts[bandwidth] = self.bandwidth_counts.get(bandwidth, 0) + sign
        for name in node.other_allocatable:
            self.resource_nodes[name] = self.resource_nodes.get(name, 0) + sign

    def _note_headroom(self, node: NodeState, nodes: Mapping[str, NodeState]) -> None:
        for name in node.other_allocatable:
            heap = self.headroom_per_gpu.setdefault(name, [])
            heapq.heappush(heap, (node.headroom(name) / node.free, node.name))
            if len(heap) > 4 * len(nodes) + 1024:  # mostly stale entries: keep the current ones
                heap[:] = [(n.headroom(name) / n.free, n.name) for n in nodes.values()
                           if n.free > 0 and name in n.other_allocatable]
                heapq.heapify(heap)

    def _least_headroom_per_gpu(self, resource: str, nodes: Mapping[str, NodeState]) -> float | None:
        """The lowest headroom per free GPU of `resource` over nodes with free GPUs (None: none)."""
        for changed in self._headroom_changed:  # noted here, not on every pod event
            node = nodes.get(changed)
            if node is not None and node.free > 0 and node.gpus > 0:
                self._note_headroom(node, nodes)
        self._headroom_changed.clear()
        heap = self.headroom_per_gpu.get(resource, [])
        while heap:
            ratio, name = heap[0]
            node = nodes.get(name)
            if node is not None and node.free > 0 and node.headroom(resource) / node.free == ratio:
                return ratio
            heapq.heappop(heap)
        return None

    def _matching(self, key: str, values: Iterable[str]) -> int:
        return sum(len(self.by_label.get((key, v), ())) for v in values)

    def _admits_all(self, expr: Mapping) -> bool:
        """Whether one matchExpression admits every GPU node, from the label counts alone."""
        key, op, values = str(expr.get("key") or ""), expr.get("operator"), expr.get("values") or ()
        if op == "In":
            return self._matching(key, values) == self.gpu_nodes
        if op == "NotIn":
            return self._matching(key, values) == 0
        if op == "Exists":
            return self.key_counts.get(key, 0) == self.gpu_nodes
        if op == "DoesNotExist":
            return self.key_counts.get(key, 0) == 0
        return False  # Gt/Lt: decided node by node

    def filters_nothing(self, request: PlacementRequest, nodes: Mapping[str, NodeState]) -> bool:
        """True when the request's node constraints admit every GPU node, judged from label,
        taint and bandwidth counts without visiting nodes (the common case)."""
        if any(not tolerates(request.tolerations, t) for t, n in self.taint_counts.items() if n > 0):
            return False
        if any(len(self.by_label.get(item, ())) != self.gpu_nodes for item in request.node_selector.items()):
            return False
        if request.required_node_terms and not any(
                not term.get("matchFields") and all(self._admits_all(e) for e in term.get("matchExpressions") or ())
                for term in request.required_node_terms):
            return False
        wanted = request.min_bandwidth_gbps or 0
        if any(bw < wanted for bw, n in self.bandwidth_counts.items() if n > 0):
            return False
        # Other resources never run out before GPUs on any node with free GPUs: GPUs alone decide.
        for name, amount in request.resources:
            if self.resource_nodes.get(name, 0) < self.gpu_nodes:
                return False
            least = self._least_headroom_per_gpu(name, nodes)
            if least is not None and least * request.gpus_per_pod < amount:
                return False
        return True

    def candidates(self, request: PlacementRequest, nodes: Mapping[str, NodeState]) -> Iterable[NodeState]:
        """Nodes worth testing against the request: narrowed by nodeSelector and `In` terms (of
        labels, and of node names)."""
        narrowed: list[set[str]] = [self.by_label.get(item, set()) for item in request.node_selector.items()]
        per_term: list[set[str]] = []
        for term in request.required_node_terms:
            ins = [set().union(*(self.by_label.get((e.get("key"), v), set()) for v in e.get("values") or ()))
                   for e in term.get("matchExpressions") or () if e.get("operator") == "In"]
            ins += [set(e.get("values") or ()) for e in term.get("matchFields") or ()
                    if e.get("key") == "metadata.name" and e.get("operator") == "In"]
            if not ins:
                per_term = []
                break
            per_term.append(set.intersection(*ins))
        if per_term:
            narrowed.append(set().union(*per_term))
        if not narrowed:
            return nodes.values()
        return [nodes[name] for name in sorted(set.intersection(*narrowed)) if name in nodes]


    def has_room_ever(self, nodes: Mapping[str, NodeState], expressions: list[Mapping], gpus: int,
                      staying: Callable[[NodeState], int]) -> bool:
        """Whether an in-service node matching every `In` and `DoesNotExist` expression could hold
        a pod of `gpus` GPUs once everything on it has ended but the GPUs `staying` says stay there.
        Stops at the first such node: asked for every pod a controller makes from a pinned template,
        it must not read a whole domain each time (a 1,000-pod burst into a 1,000-node spine)."""
        wanted = [(str(e.get("key")), {str(v) for v in e.get("values") or ()}) for e in expressions
                  if e.get("operator") == "In"]
        absent = {str(e.get("key")) for e in expressions if e.get("operator") == "DoesNotExist"}
        if not wanted:
            return False
        narrowest = min(wanted, key=lambda kv: sum(len(self.by_label.get((kv[0], v), ())) for v in kv[1]))
        for value in narrowest[1]:
            for name in self.by_label.get((narrowest[0], value), ()):
                node = nodes.get(name)
                if node is not None and node.eligible and all(node.labels.get(k) in values for k, values in wanted) \
                        and absent.isdisjoint(node.labels) and node.gpus - staying(node) >= gpus:
                    return True
        return False


def _names_nodes(request: PlacementRequest) -> bool:
    return any(e.get("key") == "metadata.name" for term in request.required_node_terms
               for e in term.get("matchFields") or ())


def _signature(request: PlacementRequest, terms: object) -> tuple:
    """What a subset for `request` depends on, its required terms read as `terms` (as JSON with keys
    sorted: orjson takes a fifteenth of json's time, and an allotment's terms name dozens of nodes)."""
    return (tuple(sorted(request.node_selector.items())), request.min_bandwidth_gbps,
            orjson.dumps([terms, request.tolerations], option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS),
            request.resources,
            request.gpus_per_pod if request.resources else 0)


def _unnamed(request: PlacementRequest) -> tuple:
    """What a subset depends on besides the node names the request's terms list."""
    return _signature(request, [{**term, "matchFields": [e for e in term.get("matchFields") or ()
                                                         if e.get("key") != "metadata.name"]}
                                for term in request.required_node_terms])


def _matching(request: PlacementRequest, tree: TopologyTree, filters: NodeFilters) -> Iterator[NodeState]:
    """The nodes of `tree` a subset for `request` holds."""
    return (node for node in filters.candidates(request, tree.nodes) if node_matches(node, request))


class ConstrainedSubsets:
    """Trees of the nodes constrained requests may use, by their constraints (at most
    `MAX_SUBSETS`, least recently used dropped), so repeated selectors cost one build. Of those
    naming nodes (a group placed by another replica, an allotment's nodes for spreads), which
    change as GPUs are held and freed, only the last MAX_NAMED_SUBSETS are kept: every subset is
    counted again at every change of its nodes. A request naming other nodes but otherwise alike
    takes the least recently used such subset over, moving only the nodes that differ: an
    allotment's nodes for spreads change by a few at each of its writes (66 nodes, 10 of them
    changed: 0.6 ms moved against 1.8 ms built, bench/subsets_bench.py)."""

    def __init__(self) -> None:
        self._subsets: OrderedDict[tuple, tuple[PlacementRequest, TopologyTree]] = OrderedDict()

    def __iter__(self) -> Iterator[tuple[PlacementRequest, TopologyTree]]:
        return iter(self._subsets.values())

    def clear(self) -> None:
        self._subsets.clear()

    def for_request(self, request: PlacementRequest, tree: TopologyTree, filters: NodeFilters) -> TopologyTree:
        signature = _signature(request, request.required_node_terms)
        cached = self._subsets.get(signature)
        if cached is None and _names_nodes(request):
            cached = self._renamed(signature, request, tree, filters)
        if cached is None:
            subset = TopologyTree(tree.config, tree.width, serves=request, orderings=tree.orderings)
            for node in _matching(request, tree, filters):
                subset.attach(dataclasses.replace(node, parent=None))  # shares pods and holds
            cached = self._subsets[signature] = (request, subset)
            named = [key for key, (held, _) in self._subsets.items() if _names_nodes(held)]
            for key in named[:-MAX_NAMED_SUBSETS]:
                del self._subsets[key]
            if len(self._subsets) > MAX_SUBSETS:
                self._subsets.popitem(last=False)
        self._subsets.move_to_end(signature)
        return cached[1]

    def _renamed(self, signature: tuple, request: PlacementRequest, tree: TopologyTree, filters: NodeFilters
                 ) -> tuple[PlacementRequest, TopologyTree] | None:
        """A named subset alike but for its names, kept as full (MAX_NAMED_SUBSETS), now serving `request`."""
        named = [key for key, (held, _) in self._subsets.items() if _names_nodes(held)]
        if len(named) < MAX_NAMED_SUBSETS:
            return None
        unnamed = _unnamed(request)
        old = next((key for key in named if _unnamed(self._subsets[key][0]) == unnamed), None)
        if old is None:
            return None
        _, subset = self._subsets.pop(old)
        subset.serves = request
        wanted = {node.name: node for node in _matching(request, tree, filters)}
        for name in [name for name in subset.nodes if name not in wanted]:
            subset.detach(subset.nodes[name])
        for name, node in wanted.items():
            if name not in subset.nodes:
                subset.attach(dataclasses.replace(node, parent=None))
        cached = self._subsets[signature] = (request, subset)
        return cached

    def node_changed(self, fresh: NodeState) -> None:
        """Move a new or changed node in or out of each subset."""
        for request, subset in self._subsets.values():
            if fresh.name in subset.nodes:
                subset.detach(subset.nodes[fresh.name])
            if node_matches(fresh, request):
                subset.attach(dataclasses.replace(fresh, parent=None))  # shares pods and holds

    def node_deleted(self, name: str) -> None:
        for _, subset in self._subsets.values():
            if name in subset.nodes:
                subset.detach(subset.nodes[name])

    def recount(self, name: str) -> None:
        """A node's pods, holds or requests changed: its GPUs as each subset counts them."""
        for _, subset in self._subsets.values():
            copy = subset.nodes.get(name)
            if copy is not None:
                usable = subset.usable_free(copy)
                if usable != copy.free:
                    subset.shift_free(copy, copy.free, usable)

    def shift_freeing(self, name: str, delta: int) -> None:
        for _, subset in self._subsets.values():
            copy = subset.nodes.get(name)
            if copy is not None:
                subset.shift_freeing(copy, delta)
