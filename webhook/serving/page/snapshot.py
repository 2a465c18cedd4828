"""What the topology page shows: one plain snapshot of the cluster index and of recent decisions.

`snapshot` turns the index (read under its lock, in time bounded by the number of domains, holds
and out-of-service nodes, or by nodes only when they are few enough to draw) and the recorded
decisions into a dict of names and numbers, never object bodies. The page and /topology.json are
both made from it, so they agree by construction. The schema is in docs/topology-page.md.

Per node the GPU counts are those placement uses: free is the node's free count, used what its
pods take, held what the ledger holds there (out-of-service nodes: whatever neither takes is out).
Domains sum their nodes' counts from the tree's aggregates plus the few nodes that hold or are
out, so a domain's numbers equal the sum of its nodes' without visiting every node.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Iterator, Sequence, cast

from ...admission import AdmissionOutcome
from ...state.index import ClusterIndex
from ...state.tree import Domain, NodeState
from ...admission.recent import NODES_PER_ENTRY, RecordedDecision
from .nodes import gpu_states, natural, node_counts, split_key, state_of

SCHEMA_VERSION = 1
NODE_DETAIL_LIMIT = 2000  # above this many nodes, nodes are drawn only inside a focused domain
HEATMAP_NODE_LIMIT = 10_000  # up to this many GPU nodes the overview has a cell per node; above, per domain
BLOCK_LIMIT = 5000  # blocks are drawn down to the deepest level with at most this many domains
LIST_LIMIT = 500  # holds and out-of-service nodes listed (all are counted)
FILTER_MAX_CHARS = 253  # a namespace or name filter longer than any Kubernetes name is cut
WORKLOADS_PER_NODE = 8  # workloads named per node (its pods' reservations); the rest are counted
CELL_CHUNK = 250  # the overview's cells are read this many nodes at a time, each time under the index lock


@dataclass(frozen=True)
class Selection:
    """What the reader asked to see: a namespace (exact), a workload (part of its name, any
    case), and a domain whose nodes to draw however large the cluster is; and the namespaces the
    reader may see workloads of (None: every one). Workloads and holds of any other namespace are
    neither listed, counted nor outlined: the tree's numbers (capacity) are the same for everyone."""

    namespace: str = ""
    workload: str = ""
    focus: str = ""
    namespaces: frozenset[str] | None = None

    @classmethod
    def of(cls, namespace: str = "", workload: str = "", focus: str = "",
           namespaces: frozenset[str] | None = None) -> "Selection":
        return cls(namespace.strip()[:FILTER_MAX_CHARS], workload.strip()[:FILTER_MAX_CHARS],
                   focus.strip()[:FILTER_MAX_CHARS], namespaces)

    @property
    def filtering(self) -> bool:
        return bool(self.namespace or self.workload)

    def matches(self, namespace: str, name: str) -> bool:
        return ((not self.namespace or namespace == self.namespace)
                and (self.namespaces is None or namespace in self.namespaces)
                and self.workload.lower() in name.lower())


def nodes_below(domain: Domain) -> Iterator[list[NodeState]]:
    """The nodes under `domain`, in lists by their domain at the last level, those in natural order."""
    children = list(domain.children.values())
    if children and isinstance(children[0], Domain):
        for child in sorted(cast("list[Domain]", children), key=lambda child: natural(child.ref.name)):
            yield from nodes_below(child)
    else:
        yield cast("list[NodeState]", children)


class _Reader:
    """One snapshot's reading of the index; made and used inside `index.locked()`."""

    def __init__(self, index: ClusterIndex, selection: Selection, marked: set[str]):
        self.index = index
        self.selection = selection
        self.marked = marked
        tree = index.whole_tree()
        self.width = tree.width
        self.sizes = sorted({g for g in (1, 2, 4, 8, 16, 32, 64) if g <= self.width} | {self.width})
        self.gpu_nodes = sum(1 for node in index.nodes.values() if node.gpus > 0)
        self.draw_all = self.gpu_nodes <= NODE_DETAIL_LIMIT
        self.node_cells = self.gpu_nodes <= HEATMAP_NODE_LIMIT
        self.workload_of = index.pod_reservations()  # bound pod key -> the reservation key it carries
        # The overview's cells: each block's nodes by domain, listed under the lock, read by make_cells.
        self.unmade: list[tuple[dict, list[list[NodeState]]]] = []
        levels = index.levels
        # The deepest level drawn as blocks; below it only a focused domain opens.
        self.block_depth = max((depth for depth, level in enumerate(levels) if len(level) <= BLOCK_LIMIT), default=-1)
        # Per domain: what its nodes that hold GPUs or are out of service add to the aggregates.
        self.extra: dict[int, dict[str, int]] = {}
        self.marked_domains: set[int] = set()
        special = set(tree.out_of_service)
        special.update(node for hold, _ in index.workload_holds() for node in hold.sets)
        special.update(node for _, node, _ in index.pod_holds())
        for name in special:
            node = index.nodes.get(name)
            if node is None or not (node.held or node.out):
                continue
            counts = node_counts(node)
            for domain in tree.ancestors(node):
                extra = self.extra.setdefault(id(domain), {"held": 0, "out": 0, "out_total": 0})
                extra["held"] += counts["held"]
                extra["out"] += counts["out"]
                extra["out_total"] += node.gpus if node.out else 0
        for name in marked:
            node = index.nodes.get(name)
            if node is not None:
                self.marked_domains.update(id(domain) for domain in tree.ancestors(node))

    def domain(self, domain: Domain, open_nodes: bool = False) -> dict:
        extra = self.extra.get(id(domain), {"held": 0, "out": 0, "out_total": 0})
        total = domain.alloc_gpus + extra["out_total"]
        used = total - domain.free_gpus - extra["held"] - extra["out"]
        largest_pod = domain.most_free
        gpus = {"total": total, "used": used, "held": extra["held"], "free": domain.free_gpus, "out": extra["out"]}
        block = {
            "level": domain.ref.level_name, "name": domain.ref.name,
            "nodes": domain.nodes,
            "gpus": gpus,
            "utilization": round(1 - domain.free_gpus / domain.alloc_gpus, 4) if domain.alloc_gpus else 0.0,
            "partly_used_nodes": domain.partly_used,
            "pods_fitting": {str(g): domain.fits_now(g) for g in self.sizes},
            "largest_pod_gpus": largest_pod,
            "largest_job_gpus": self.width * domain.fits_now(self.width),
            "marked": id(domain) in self.marked_domains,
            "state": state_of(gpus),
        }
        open_nodes = open_nodes or self.draw_all or (bool(self.selection.focus) and domain.ref.name == self.selection.focus
                                                     and domain.nodes <= NODE_DETAIL_LIMIT)
        children = list(domain.children.values())
        if children and isinstance(children[0], Domain):  # all domains, or at the last level all nodes
            deeper = [child for child in cast("list[Domain]", children) if child.fits_idle(1)]
            if len(deeper) < len(children):  # CPU pools: nothing to place there
                block["domains_without_gpus"] = len(children) - len(deeper)
            if domain.ref.level < self.block_depth or open_nodes:
                deeper.sort(key=lambda child: natural(child.ref.name))
                block["children"] = [self.domain(child, open_nodes) for child in deeper]
            else:
                block["hidden_domains"] = len(deeper)
                if self.node_cells:
                    self.detach(block, domain)
        elif open_nodes:
            nodes = sorted(cast("list[NodeState]", children), key=lambda node: natural(node.name))
            block["node_list"] = [self.node(node) for node in nodes if node.gpus > 0]
            block["nodes_without_gpus"] = sum(1 for node in nodes if node.gpus == 0)
        elif self.node_cells:
            self.detach(block, domain)
        return block

    def node(self, node: NodeState) -> dict:
        counts = node_counts(node)
        return {"name": node.name, "out": node.out, "gpus": counts, "nvlink": gpu_states(node, counts),
                "marked": node.name in self.marked, "state": state_of(counts, bool(node.out)),
                "pods": len(node.pods), "workloads": self.workloads(node)}

    def detach(self, block: dict, domain: Domain) -> None:
        """List the nodes of `domain` for its cells (`make_cells`, after this lock)."""
        self.unmade.append((block, list(nodes_below(domain))))

    def make_cells(self) -> None:
        """Every block's cells, CELL_CHUNK nodes at a time, each chunk under the index lock: an
        admission waits behind a chunk (a few ms), never behind all 10,000. So a cell may be read a
        few ms after its domain's sums were."""
        nodes = [node for _, groups in self.unmade for group in groups
                 for node in sorted(group, key=lambda node: natural(node.name)) if node.gpus > 0]
        cells: list[dict] = []
        for start in range(0, len(nodes), CELL_CHUNK):
            with self.index.locked():
                cells.extend(self.cell(node) for node in nodes[start:start + CELL_CHUNK])
        made = iter(cells)
        for block, groups in self.unmade:
            block["cells"] = [next(made) for group in groups for node in group if node.gpus > 0]

    def cell(self, node: NodeState) -> dict:
        """A node in short, for the overview: what `node` says less what its letters say again."""
        counts = node_counts(node)
        cell = {"name": node.name, "state": state_of(counts, bool(node.out)), "nvlink": gpu_states(node, counts),
                "pods": len(node.pods)}
        if node.out:
            cell["out"] = node.out
        if node.name in self.marked:
            cell["marked"] = True
        workloads = self.workloads(node) if node.pods else []
        if workloads:
            cell["workloads"] = workloads
        return cell

    def workloads(self, node: NodeState) -> list[str]:
        """The workloads (namespace/Kind/name) whose pods run on `node`, of the selected namespaces,
        at most WORKLOADS_PER_NODE: from the reservation each pod we placed carries."""
        keys = {self.workload_of.get(pod) for pod in node.pods}
        keys.discard(None)
        seen = sorted(key for key in cast("set[str]", keys) if self.selection.matches(*split_key(key)[::2]))
        return seen[:WORKLOADS_PER_NODE]

    def holds(self, now: float) -> tuple[list[dict], int]:
        """Holds of the selected workloads, soonest expiry first: made at admission (with their
        expiry; "provisional admission" until the watch shows the workload stored as admitted), or
        read from pending pods that carry our placement (held until they bind)."""
        rows = []
        for hold, firm in self.index.workload_holds():
            key = hold.key
            namespace, kind, name = split_key(key)
            if self.selection.matches(namespace, name):
                rows.append({"key": key, "namespace": namespace, "kind": kind, "name": name,
                             "gpus": sum(len(ids) for sets in hold.sets.values() for ids in sets),
                             "nodes": sorted(hold.sets, key=natural)[:NODES_PER_ENTRY], "node_count": len(hold.sets),
                             "expires_in_s": round(hold.expires_at - now, 1),
                             "source": "admission" if firm else "provisional admission"})
        pending: dict[str, dict[str, int]] = {}
        for key, node, ids in self.index.pod_holds():
            if self.index.hold(key) is None:
                by_node = pending.setdefault(key, {})
                by_node[node] = by_node.get(node, 0) + len(ids)
        for key, by_node in pending.items():
            namespace, kind, name = split_key(key)
            if self.selection.matches(namespace, name):
                rows.append({"key": key, "namespace": namespace, "kind": kind, "name": name,
                             "gpus": sum(by_node.values()), "nodes": sorted(by_node, key=natural)[:NODES_PER_ENTRY],
                             "node_count": len(by_node), "expires_in_s": None, "source": "pending pods"})
        rows.sort(key=lambda row: (row["expires_in_s"] is None, row["expires_in_s"] or 0, row["key"]))
        return rows[:LIST_LIMIT], len(rows)

    def out_of_service(self) -> tuple[list[dict], int]:
        out = self.index.whole_tree().out_of_service
        rows = []
        for name in sorted(out, key=natural)[:LIST_LIMIT]:
            node = self.index.nodes[name]
            rows.append({"node": name, "reason": out[name], "gpus": node.gpus,
                         "domain": node.parent.ref.name if node.parent is not None else ""})
        return rows, len(out)


def latest_per_workload(decisions: Iterable[RecordedDecision], selection: Selection) -> list[RecordedDecision]:
    """Each selected workload's latest decision, newest first."""
    latest: dict[tuple[str, str, str], RecordedDecision] = {}
    for entry in decisions:
        if selection.matches(entry.namespace, entry.name):
            latest[(entry.namespace, entry.kind, entry.name)] = entry
    return sorted(latest.values(), key=lambda entry: -entry.at)


def namespaces_present(index: ClusterIndex, decisions: Iterable[RecordedDecision]) -> set[str]:
    """The namespaces of the recorded decisions and of the index's holds: those a page could list."""
    present = {entry.namespace for entry in decisions}
    with index.locked():
        present.update(split_key(hold.key)[0] for hold, _ in index.workload_holds())
        present.update(split_key(key)[0] for key, _, _ in index.pod_holds())
    return present


def snapshot(index: ClusterIndex, decisions: Sequence[RecordedDecision], now: float,
             selection: Selection = Selection()) -> dict:
    """The page's data (docs/topology-page.md has the schema). `now`: wall-clock seconds, for
    decisions' ages; holds expire by the index's own clock."""
    workloads = latest_per_workload(decisions, selection)
    marked: set[str] = set()
    if selection.filtering:
        marked.update(node for entry in workloads if entry.outcome in (AdmissionOutcome.PLACED, AdmissionOutcome.REPAIRED) for node in entry.nodes)
    with index.locked():
        if selection.filtering:
            marked.update(node for hold, _ in index.workload_holds()
                          if selection.matches(*split_key(hold.key)[::2]) for node in hold.sets)
        reader = _Reader(index, selection, marked)
        holds, holds_total = reader.holds(index.now())
        out_rows, out_total = reader.out_of_service()
        tree = reader.domain(index.root)
        levels = [level.name for level in index.config.levels]
        node_count = len(index.nodes)
    reader.make_cells()
    return {
        "version": SCHEMA_VERSION,
        "generated_at": round(now, 3),
        "levels": levels,
        "node_count": node_count,
        "gpu_node_count": reader.gpu_nodes,
        "nodes_drawn": reader.draw_all,
        "node_detail_limit": NODE_DETAIL_LIMIT,
        "overview": {"cells": "nodes" if reader.node_cells else "domains", "node_limit": HEATMAP_NODE_LIMIT,
                     "level": levels[reader.block_depth] if reader.block_depth >= 0 else "cluster"},
        "selection": {"namespace": selection.namespace, "workload": selection.workload, "focus": selection.focus},
        "namespaces_shown": None if selection.namespaces is None else sorted(selection.namespaces),
        "tree": tree,
        "workloads": [{"namespace": e.namespace, "kind": e.kind, "name": e.name, "outcome": e.outcome,
                       "gpus": e.gpus, "domain": e.domain, "code": e.code, "reasons": list(e.reasons),
                       "nodes": list(e.nodes), "age_s": round(max(0.0, now - e.at), 1), "replica": e.replica}
                      for e in workloads],
        "holds": holds, "holds_total": holds_total,
        "out_of_service": out_rows, "out_of_service_total": out_total,
    }
