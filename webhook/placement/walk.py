"""Reading the tree for a decision: walking it (a member is a domain or a node, with the same
read-only interface), finding the domains a request names (preferred-domain, max-domain), and the
node affinity that says exactly what a decision chose. Pure."""
from __future__ import annotations

from typing import Iterable, Iterator, Union

from ..core.model import EXCEEDS_MAX_DOMAIN, UNKNOWN_LEVEL, Decision, NodeRequirement, Outcome, PlacementRequest
from ..settings.presets import HOSTNAME_LABEL
from ..state.tree import Domain, NodeState, TopologyTree

Member = Union[Domain, NodeState]  # a place in the tree: a domain or a node
MAX_NAMED_NODES = 256  # nodes a pin may name one by one


def at_level(scope: Member, level: int) -> Iterator[Member]:
    """Members of `scope`'s subtree at a level (len(levels) = nodes)."""
    children = scope.children.values()
    if children and scope.ref.level + 1 == level:
        yield from children
        return
    for child in children:
        yield from at_level(child, level)


def members_at(anchor: Member, level: int) -> list[Member]:
    """`anchor`'s domains at `level`: its descendants there, or its ancestor there."""
    if anchor.ref.level < level:
        return list(at_level(anchor, level))
    return [m for m in ancestry(anchor) if m.ref.level == level]


def ancestry(member: Member) -> list[Member]:
    chain: list[Member] = [member]
    parent = member.parent
    while parent is not None:
        chain.append(parent)
        parent = parent.parent
    return chain


def child_towards(node: NodeState, scope: Member) -> Member:
    """The child of `scope` on the way down to `node`."""
    member: Member = node
    while member.parent is not scope:
        assert member.parent is not None, f"{node.name} is not under {scope.label}"
        member = member.parent
    return member


def is_under(path: tuple, ancestor: tuple) -> bool:
    return path[: len(ancestor)] == ancestor


def resolve(tree: TopologyTree, subset: TopologyTree, text: str) -> Member | str:
    """A preferred-domain value -> the member of `subset` nearest to it, or an error sentence."""
    level_name, _, value = text.strip().rpartition("=")
    paths = sorted(tree.by_value.get(value, ()))
    if level_name:
        paths = [p for p in paths if level_name_of(tree, p) == level_name or p[-1][0] == level_name]
    if len(paths) != 1:
        if paths:
            options = ", ".join(f"{level_name_of(tree, p)}={value}" for p in paths)
            return f"preferred-domain {text!r} is ambiguous; write one of: {options}"
        known = [f"{lv.name}: {listed(sorted({d.ref.name for d in tree.levels[i].values()}))}"
                 for i, lv in enumerate(tree.config.levels) if tree.levels[i]]
        return (f"preferred-domain {text!r} matches no domain; allowed: a label value at any level or "
                f"LEVEL=VALUE ({'; '.join(known) or 'the cluster has no labelled domains'})")
    path = paths[0]
    for depth in range(len(path), 0, -1):  # the deepest part of it the request may use
        member = lookup(subset, path[:depth])
        if member is not None:
            return member
    return subset.root


def listed(names: list[str], most: int = 12) -> str:
    """Every name, or the first `most` and how many more (a denial stays one readable line)."""
    shown = ", ".join(names[:most])
    return shown if len(names) <= most else f"{shown}, ... and {len(names) - most} more"


def level_name_of(tree: TopologyTree, path: tuple) -> str:
    return tree.config.levels[len(path) - 1].name if len(path) <= len(tree.config.levels) else "node"


def lookup(subset: TopologyTree, path: tuple) -> Member | None:
    if len(path) <= len(subset.levels):
        return subset.levels[len(path) - 1].get(path)
    node = subset.nodes.get(path[-1][1])
    return node if node is not None and node.path == path else None


def as_node(member: Member) -> NodeState:
    """`member`, known to be a node (it has no children)."""
    assert isinstance(member, NodeState), f"{member.label} is a domain, not a node"
    return member


def as_nodes(members: list[Member]) -> list[NodeState]:
    return [as_node(m) for m in members]


def nodes_under(member: Member) -> Iterator[NodeState]:
    if not member.children:
        yield as_node(member)
        return
    for child in member.children.values():
        yield from nodes_under(child)


def nodes_fitting(member: Member, gpus: int) -> list[NodeState]:
    """The nodes under `member` with room for a pod of `gpus` GPUs, in no set order, skipping every
    domain that has none: under load most of a large domain is full, and its free capacity index
    says so. (A loop, not nested generators: a decision may run it over a zone's nodes.)"""
    if not member.children:
        return [as_node(member)] if member.fits_now(gpus) else []
    found: list[NodeState] = []
    domains = [member]
    while domains:
        for child in domains.pop().children.values():
            if child.fits_now(gpus):
                if child.children:
                    domains.append(child)
                else:
                    found.append(as_node(child))
    return found


def requirements(subset: TopologyTree, scope: Member, used: Iterable[NodeState] = ()) -> tuple[NodeRequirement, ...]:
    """Node affinity that says exactly what was decided: `scope`'s labels, and, for the nodes a
    decision uses, `In` over the lowest-level domains they are in (their racks, or the nodes
    themselves where no rack label groups them). Never looser than the decision, never excluding a
    node it uses. A node is named by its `kubernetes.io/hostname` label, which kubelet may set apart
    from the node's name."""
    def value(key: str, value: str) -> str:
        return hostname(subset.nodes[value]) if key == HOSTNAME_LABEL else value

    merged: dict[str, tuple[str, ...]] = {}
    for key, name in scope.path:
        # An unnamed domain (its nodes lack the label, above a deeper one they carry) is the nodes
        # without the label: the deeper label's value alone may name domains under other parents.
        merged[key] = (value(key, name),) if name else ()
    # A node right under the cluster (no levels, e.g. hostname-only) is its own lowest domain.
    lowest = {node.domain.path[-1] if node.domain.path else (HOSTNAME_LABEL, node.name) for node in used}
    if not lowest and any(not name for _, name in scope.path):
        # A wait into an unnamed domain: labels cannot tell its nodes from nodes that lack every
        # label from that level down (each alone), so its nodes are named; past a few hundred the
        # wait is not pinned at all (never wider than the decision, never a huge affinity).
        members = {hostname(node) for node in nodes_under(scope)}
        if len(members) > MAX_NAMED_NODES:
            return ()
        merged[HOSTNAME_LABEL] = tuple(sorted(members))
    if len({key for key, _ in lowest}) == 1:
        key = next(iter(lowest))[0]
        merged[key] = tuple(sorted({value(key, name) for _, name in lowest}))
    elif lowest:  # racks for some nodes, none for others: only the nodes themselves say it exactly
        merged[HOSTNAME_LABEL] = tuple(sorted({hostname(node) for node in used}))
    return tuple(NodeRequirement(k, v) for k, v in merged.items())


def hostname(node: NodeState) -> str:
    return node.labels.get(HOSTNAME_LABEL) or node.name


def max_level(subset: TopologyTree, request: PlacementRequest) -> int | Decision:
    """The widest level the placement may use (max-domain: its name or label key; -1, the whole
    cluster, when unset), or the NEVER decision when it names no level or no domain of that level
    could ever hold the workload."""
    if request.max_domain is None:
        return -1
    levels = subset.config.levels
    wanted = request.max_domain.strip()
    names = {lv.name: i for i, lv in enumerate(levels)} | {lv.label: i for i, lv in enumerate(levels)}
    names.update({"node": len(levels), HOSTNAME_LABEL: len(levels)})
    if wanted not in names:
        allowed = ", ".join([lv.name for lv in levels] + ["node"] + [lv.label for lv in levels] + [HOSTNAME_LABEL])
        return Decision(Outcome.NEVER, request, None, code=UNKNOWN_LEVEL, reasons=(
            f"max-domain {wanted!r} is not a topology level; allowed: {allowed}",))
    level = names[wanted]
    gpus, pods = request.gpus_per_pod, request.pods
    members = subset.nodes.values() if level == len(levels) else subset.levels[level].values()
    if not any(m.fits_idle(gpus) >= pods for m in members):
        level_name = "node" if level == len(levels) else levels[level].name
        largest = max((m.fits_idle(gpus) for m in members), default=0)
        return Decision(Outcome.NEVER, request, None, code=EXCEEDS_MAX_DOMAIN, reasons=(
            f"{request.workload} needs {pods} pod(s) x {gpus} GPU(s) inside one {level_name}, and no {level_name} "
            f"holds that many even when idle (at most {largest})",))
    return level
