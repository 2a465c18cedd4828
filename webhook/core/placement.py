"""The placement core: a pure decision, with its reasons, from a cluster index and a request.

Consolidated (and balanced, which only changes how the mutation enforces it):
  1. Find the tightest domain that holds every pod whole, deepest level first: a node, then a
     leaf, a spine, a zone, the cluster. Among domains of that level take the best fit (the least
     capacity that still fits), so whole leaves and whole NVLink domains stay free for big jobs.
     A preferred domain is searched first, then its ancestors outwards (nearest by topology).
  2. Split the pods over that domain's children: the fewest children that hold them, with
     balanced shares (4+4 beats 1+7: the smallest share on a node sets the bandwidth), best-fit
     children first; recurse down to nodes.
  3. Per pod, pick an NVLink-aligned GPU set on its node (the smallest NVLink domain that holds it).
Distributed: one pod per node where possible, round-robin over leaves for failure isolation;
latency-sensitive workloads stay inside one domain of the level above the leaves.
Nothing fits now: the domain at the deepest level that could ever hold it and is closest to fitting
is named, with how much fits per level. The nodes there are cannot hold it even idle: it waits for
nodes to be added, pinned to nothing. No node could take even one of its pods: said plainly.
"""
from __future__ import annotations

import dataclasses
import heapq
import math
from typing import Callable, Iterable, Iterator, Sequence, Union

from . import estimate, orderings
from .config import HOSTNAME_LABEL
from .filters import expression_matches, node_matches, tolerates
from .growth import TOPOLOGY_IN_ADVANCE, Pool
from .model import (EXCEEDS_CLUSTER, EXCEEDS_MAX_DOMAIN, EXCEEDS_NODES, GROWS_POOL, NO_MATCHING_NODES, NO_ROOM_NOW,
                    UNKNOWN_DOMAIN, UNKNOWN_LEVEL, Decision, DomainRef, Interconnect, NodeAssignment, NodeRequirement,
                    Outcome, PlacementRequest, Strategy)
from .topology import Domain, NodeState, TopologyTree

Member = Union[Domain, NodeState]  # a place in the tree: a domain or a node
MAX_NAMED_NODES = 256  # nodes a pin may name one by one


# -- tree helpers --------------------------------------------------------------------------------

def _at_level(scope: Member, level: int) -> Iterator[Member]:
    """Members of `scope`'s subtree at a level (len(levels) = nodes)."""
    children = scope.children.values()
    if children and scope.ref.level + 1 == level:
        yield from children
        return
    for child in children:
        yield from _at_level(child, level)


def _members_at(anchor: Member, level: int) -> list[Member]:
    """`anchor`'s domains at `level`: its descendants there, or its ancestor there."""
    if anchor.ref.level < level:
        return list(_at_level(anchor, level))
    return [m for m in _ancestry(anchor) if m.ref.level == level]


def _ancestry(member: Member) -> list[Member]:
    chain: list[Member] = [member]
    parent = member.parent
    while parent is not None:
        chain.append(parent)
        parent = parent.parent
    return chain


def _child_towards(node: NodeState, scope: Member) -> Member:
    """The child of `scope` on the way down to `node`."""
    member: Member = node
    while member.parent is not scope:
        assert member.parent is not None, f"{node.name} is not under {scope.label}"
        member = member.parent
    return member


# -- the decision ----------------------------------------------------------------------------------

def decide(index: TopologyTree, request: PlacementRequest, subset: TopologyTree,
           pools: Callable[[], Sequence[Pool]] = tuple) -> Decision:
    """The decision for `request`, reading the whole tree `index` and `subset`, the part of it the
    request may use (`ClusterIndex.restricted_to`: the whole tree when nothing filters), with its
    best-fit orders caught up for the request's pod size, and, when the nodes there are have no
    room for it, the `pools` that can add nodes (read only then). Pure: it takes no lock and
    writes nothing; the caller holds the index still while it runs."""
    gpus, pods = request.gpus_per_pod, request.pods
    if gpus < 1 or pods < 1:
        raise ValueError(f"a placement needs at least one pod and one GPU per pod, got {pods} x {gpus}")
    shape = f"{pods} pod(s) x {gpus} GPU(s)"
    if subset.root.fits_idle(gpus) < pods:
        return (_invalid_domain(index, subset, request) or _onto_growth(subset, request, pools())
                or _beyond_the_nodes(index, subset, request))
    narrowest = _max_level(subset, request)
    if isinstance(narrowest, Decision):
        return narrowest
    chain: list[Member] = [subset.root]
    preferred: Member | None = None
    if request.preferred_domain:
        found = _resolve(index, subset, request.preferred_domain)
        if isinstance(found, str):
            return Decision(Outcome.NEVER, request, None, code=UNKNOWN_DOMAIN, reasons=(found,))
        preferred = found
        chain = _ancestry(preferred)
    if request.strategy is Strategy.DISTRIBUTED:
        decision = _distributed(subset, request, chain, narrowest)
    else:
        decision = _consolidated(subset, request, chain, narrowest)
    if decision.outcome is Outcome.WAIT:  # added nodes may take it sooner than running work ends
        decision = _onto_growth(subset, request, pools()) or decision
    if preferred is None or decision.outcome is not Outcome.PLACED:
        return decision
    honoured = decision.scope is not None and _is_under(decision.scope.path, preferred.path)
    note = (f"preferred {preferred.label} honoured" if honoured else
            f"preferred {preferred.label} cannot hold {shape} now ({preferred.fits(gpus)} fit); "
            f"nearest domain with room by topology: {decision.scope}")
    return dataclasses.replace(decision, preferred_honoured=honoured, reasons=(note,) + decision.reasons)


def _max_level(subset: TopologyTree, request: PlacementRequest) -> int | Decision:
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


def _is_under(path: tuple, ancestor: tuple) -> bool:
    return path[: len(ancestor)] == ancestor


def _resolve(index: TopologyTree, subset: TopologyTree, text: str) -> Member | str:
    """A preferred-domain value -> the member of `subset` nearest to it, or an error sentence."""
    level_name, _, value = text.strip().rpartition("=")
    paths = sorted(index.by_value.get(value, ()))
    if level_name:
        paths = [p for p in paths if _level_name(index, p) == level_name or p[-1][0] == level_name]
    if len(paths) != 1:
        if paths:
            options = ", ".join(f"{_level_name(index, p)}={value}" for p in paths)
            return f"preferred-domain {text!r} is ambiguous; write one of: {options}"
        known = [f"{lv.name}: {_listed(sorted({d.ref.name for d in index.levels[i].values()}))}"
                 for i, lv in enumerate(index.config.levels) if index.levels[i]]
        return (f"preferred-domain {text!r} matches no domain; allowed: a label value at any level or "
                f"LEVEL=VALUE ({'; '.join(known) or 'the cluster has no labelled domains'})")
    path = paths[0]
    for depth in range(len(path), 0, -1):  # the deepest part of it the request may use
        member = _lookup(subset, path[:depth])
        if member is not None:
            return member
    return subset.root


def _listed(names: list[str], most: int = 12) -> str:
    """Every name, or the first `most` and how many more (a denial stays one readable line)."""
    shown = ", ".join(names[:most])
    return shown if len(names) <= most else f"{shown}, ... and {len(names) - most} more"


def _level_name(index: TopologyTree, path: tuple) -> str:
    return index.config.levels[len(path) - 1].name if len(path) <= len(index.config.levels) else "node"


def _lookup(subset: TopologyTree, path: tuple) -> Member | None:
    if len(path) <= len(subset.levels):
        return subset.levels[len(path) - 1].get(path)
    node = subset.nodes.get(path[-1][1])
    return node if node is not None and node.path == path else None


# -- consolidated ------------------------------------------------------------------------------------

def _consolidated(subset: TopologyTree, request: PlacementRequest, chain: list[Member], narrowest: int) -> Decision:
    gpus, pods = request.gpus_per_pod, request.pods
    for scope in chain:
        target = _tightest_fit(subset, scope, pods, gpus)
        if target is not None and target.ref.level >= narrowest:  # never wider than max-domain
            return _placed(subset, request, target, _split(target, pods, gpus))
    return _waiting(subset, request, chain)


def _tightest_fit(subset: TopologyTree, scope: Member, pods: int, gpus: int) -> Member | None:
    """The deepest, then best-fitting member under `scope` that holds all pods whole."""
    node = _tightest_node(subset, scope, pods * gpus, gpus)
    if node is not None:
        return node
    for level in range(len(subset.levels) - 1, scope.ref.level, -1):
        if scope is subset.root:  # the whole level: its sorted order answers (bestfit.py)
            best = subset.orders[level].best_fit(gpus, pods)
            if best is not None:
                return best
            continue
        fitting = [d for d in _at_level(scope, level) if d.fits(gpus) >= pods]
        if fitting:
            return min(fitting, key=lambda d: orderings.best_fit(d, gpus))
    return scope if scope.fits(gpus) >= pods else None


def _tightest_node(subset: TopologyTree, scope: Member, need: int, gpus: int) -> NodeState | None:
    """Hierarchical best fit for a single node: the smallest free count that holds `need`, found
    from the scope's histogram, then down through the domains that have such a node, those with
    the most partly used nodes first, the fullest among equals."""
    best = next((f for f in range(need, subset.width + 1) if scope.has_free(f)), None)
    if best is None:
        return None
    member: Member = scope
    while member.children:
        kids = [c for c in member.children.values() if c.has_free(best)]
        if not kids[0].children:  # nodes, the tree's leaves
            return min(_nodes(kids), key=lambda n: orderings.aligned_first(n, gpus))
        member = min(kids, key=lambda d: orderings.with_small_jobs_first(d, gpus))
    return _node(member)


def _node(member: Member) -> NodeState:
    """`member`, known to be a node (it has no children)."""
    assert isinstance(member, NodeState), f"{member.label} is a domain, not a node"
    return member


def _nodes(members: list[Member]) -> list[NodeState]:
    return [_node(m) for m in members]


def _split(member: Member, pods: int, gpus: int) -> list[tuple[NodeState, int]]:
    """Pods per node under `member`, over the fewest children that hold them.

    Across nodes the shares are balanced: the node with the fewest of the job's GPUs sets its
    NIC bandwidth, so 4+4 beats 1+7. Across switches the split does not change the estimate
    (every node brings its own NICs; crossing costs the same), so there the roomiest children are
    filled first and the remainder goes to the tightest child that holds it, which leaves the
    fewest partly used leaves behind (Kueue's BestFit does the same)."""
    if not member.children:
        return [(_node(member), pods)]
    kids = sorted((c for c in member.children.values() if c.fits(gpus) > 0),
                  key=lambda c: (-c.fits(gpus), c.free_gpus, c.path))
    if not kids[0].children:  # across nodes
        chosen, shares = _balanced(kids, pods, gpus)
    else:
        chosen, shares = _roomiest_then_tightest(kids, pods, gpus)
    result: list[tuple[NodeState, int]] = []
    for kid, n in zip(chosen, shares):
        if n:
            result.extend(_split(kid, n, gpus))
    return result


def _fewest(kids: list[Member], pods: int, gpus: int) -> int:
    """How many of `kids` (roomiest first) it takes to hold the pods."""
    total = 0
    for count, kid in enumerate(kids, start=1):
        total += kid.fits(gpus)
        if total >= pods:
            return count
    return len(kids)


def _balanced(kids: list[Member], pods: int, gpus: int) -> tuple[list[Member], list[int]]:
    count = _fewest(kids, pods, gpus)
    share = math.ceil(pods / count)
    even = [c for c in kids if c.fits(gpus) >= share]
    if len(even) >= count:  # best fit among the children that can take an even share
        chosen = sorted(even, key=lambda c: (c.fits(gpus), c.free_gpus, c.path))[:count]
        return chosen, [pods // count + (1 if i < pods % count else 0) for i in range(count)]
    # Uneven capacities: water-fill from the smallest so the minimum share is as large as possible.
    chosen = sorted(kids[:count], key=lambda c: (c.fits(gpus), c.path))
    shares, left = [], pods
    for i, kid in enumerate(chosen):
        give = min(kid.fits(gpus), math.ceil(left / (count - i)))
        shares.append(give)
        left -= give
    return chosen, shares


def _roomiest_then_tightest(kids: list[Member], pods: int, gpus: int) -> tuple[list[Member], list[int]]:
    chosen: list[Member] = []
    shares: list[int] = []
    left = pods
    for i, kid in enumerate(kids):
        if kid.fits(gpus) >= left:  # the rest fits in one child: the tightest that holds it
            last = min(kids[i:], key=lambda c: (c.fits(gpus) < left, c.fits(gpus), c.free_gpus, c.path))
            return chosen + [last], shares + [left]
        chosen.append(kid)
        shares.append(kid.fits(gpus))
        left -= kid.fits(gpus)
    return chosen, shares


# -- distributed --------------------------------------------------------------------------------------

def _distributed(subset: TopologyTree, request: PlacementRequest, chain: list[Member], narrowest: int) -> Decision:
    gpus, pods = request.gpus_per_pod, request.pods
    depth = len(subset.levels)
    scope: Member | None = None
    if request.latency_sensitive and depth >= 1:
        # Short hops: the tightest domain of the level above the leaves that holds every pod
        # (one per node if it can), nearest the preferred domain; wider levels only if none does.
        for anchor in chain:
            for level in range(max(0, depth - 2), -1, -1):
                fitting = [d for d in _members_at(anchor, level) if d.fits(gpus) >= pods]
                if fitting:
                    scope = min(fitting, key=lambda d: (d.slots(gpus) < pods, d.slots(gpus), d.free_gpus, d.path))
                    break
            if scope is not None:
                break
        scope = scope or (subset.root if subset.root.fits(gpus) >= pods else None)
    else:
        scope = next((m for m in chain if m.fits(gpus) >= pods), None)
    if scope is not None and scope.ref.level < narrowest:  # max-domain: the roomiest domain of that level
        fitting = [d for anchor in chain for d in _members_at(anchor, narrowest) if d.fits(gpus) >= pods]
        scope = min(fitting, key=lambda d: (-d.slots(gpus), d.free_gpus, d.path)) if fitting else None
    if scope is None:
        return _waiting(subset, request, chain)
    used = _spread(subset, scope, pods, gpus, depth)
    placed = [(subset.nodes[name], n) for name, n in used.items()]
    spread_label = subset.config.levels[-1].label if depth else None
    decision = _placed(subset, request, scope, placed, spread=(HOSTNAME_LABEL,) + (
        (spread_label,) if spread_label else ()), pin=scope is not subset.root)
    if len(used) < pods:
        return dataclasses.replace(decision, reasons=decision.reasons + (
            f"only {len(used)} node(s) in {scope.label} have {gpus} free GPUs: some pods share a node",))
    return decision


def _spread(subset: TopologyTree, scope: Member, pods: int, gpus: int, depth: int) -> dict[str, int]:
    """Pods per node name: round-robin over the leaves with the most open nodes, the tightest
    open node of a leaf first; a node takes a second pod only when no open node is left."""
    groups: Sequence[Member]
    if scope is subset.root and depth:  # the level's roomiest order answers (bestfit.py)
        groups = subset.orders[depth - 1].roomiest(gpus, pods)
    elif scope.ref.level < depth - 1:
        open_leaves = [(d.slots(gpus), d) for d in _at_level(scope, depth - 1)]
        roomiest = heapq.nsmallest(pods, ((-n, d.ref.path, d) for n, d in open_leaves if n), key=lambda x: x[:2])
        groups = [leaf for _, _, leaf in roomiest]
    else:
        groups = [scope]
    queues = [sorted((n for n in _nodes_under(g) if n.free >= gpus), key=lambda n: (n.free, n.name)) for g in groups]
    used: dict[str, int] = {}
    taken = [0] * len(groups)
    for _ in range(pods):
        open_groups = [i for i in range(len(groups)) if taken[i] < len(queues[i])]
        if not open_groups:
            break
        i = min(open_groups, key=lambda k: (taken[k], -(len(queues[k]) - taken[k]), k))
        used[queues[i][taken[i]].name] = 1
        taken[i] += 1
    left = pods - sum(used.values())
    while left:  # fewer open nodes than pods: stack onto the nodes with the most room left
        nodes = [n for n in _nodes_under(scope) if n.free >= gpus * (used.get(n.name, 0) + 1)]
        node = max(nodes, key=lambda n: (n.free - gpus * used.get(n.name, 0), n.name))
        used[node.name] = used.get(node.name, 0) + 1
        left -= 1
    return used


def _nodes_under(member: Member) -> Iterator[NodeState]:
    if not member.children:
        yield _node(member)
        return
    for child in member.children.values():
        yield from _nodes_under(child)


# -- building the decision ------------------------------------------------------------------------------

def _requirements(subset: TopologyTree, scope: Member, used: Iterable[NodeState] = ()) -> tuple[NodeRequirement, ...]:
    """Node affinity that says exactly what was decided: `scope`'s labels, and, for the nodes a
    decision uses, `In` over the lowest-level domains they are in (their racks, or the nodes
    themselves where no rack label groups them). Never looser than the decision, never excluding a
    node it uses. A node is named by its `kubernetes.io/hostname` label, which kubelet may set apart
    from the node's name."""
    def value(key: str, value: str) -> str:
        return _hostname(subset.nodes[value]) if key == HOSTNAME_LABEL else value

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
        members = {_hostname(node) for node in _nodes_under(scope)}
        if len(members) > MAX_NAMED_NODES:
            return ()
        merged[HOSTNAME_LABEL] = tuple(sorted(members))
    if len({key for key, _ in lowest}) == 1:
        key = next(iter(lowest))[0]
        merged[key] = tuple(sorted({value(key, name) for _, name in lowest}))
    elif lowest:  # racks for some nodes, none for others: only the nodes themselves say it exactly
        merged[HOSTNAME_LABEL] = tuple(sorted({_hostname(node) for node in used}))
    return tuple(NodeRequirement(k, v) for k, v in merged.items())


def _hostname(node: NodeState) -> str:
    return node.labels.get(HOSTNAME_LABEL) or node.name


def _placed(subset: TopologyTree, request: PlacementRequest, scope: Member, split: list[tuple[NodeState, int]],
            spread: tuple[str, ...] = (), pin: bool = True) -> Decision:
    gpus = request.gpus_per_pod
    assignment = []
    for node, count in sorted(split, key=lambda s: s[0].name):
        taken = node.taken_ids
        sets = []
        for _ in range(count):
            ids = node.pick_gpus(gpus, taken)
            taken.update(ids)
            sets.append(ids)
        links = [node.link_for(ids) for ids in sets]
        assignment.append(NodeAssignment(node.name, count, tuple(sets), max(links, key=lambda lk: lk.rank)))
    interconnect, bandwidth, profile = estimate.bus_bandwidth(subset, request, assignment)
    # The switches used below the scope (its children that are domains, not nodes).
    used_children = {_child_towards(node, scope).ref.name for node, _ in split
                     if scope.children and _child_towards(node, scope).children}
    domains = tuple(sorted((c.ref for c in scope.children.values() if c.children and c.ref.name in used_children),
                           key=lambda r: r.path)) or (scope.ref,)
    reasons = [_why(subset, request, scope, domains)]
    if request.pods == 1 and assignment:
        ids = assignment[0].gpu_ids[0]
        reasons.append(f"GPUs {','.join(map(str, ids))} on {assignment[0].node}: "
                       + ("one NVLink domain" if assignment[0].interconnect is Interconnect.NVLINK
                          else "no NVLink domain holds them all, so traffic crosses PCIe"))
    reasons.append(f"traffic crosses {interconnect.value}; estimated all-reduce bus bandwidth "
                   f"{bandwidth:.0f} GB/s ({profile.name}{', estimate' if profile.estimate else ''})")
    # Distributed pins only its scope: below it the spread constraints do the work.
    confine = [node for node, _ in split] if request.strategy is not Strategy.DISTRIBUTED else []
    return Decision(Outcome.PLACED, request, scope.ref, domains=domains, assignment=tuple(assignment),
                    requirements=_requirements(subset, scope, confine) if pin else (),
                    spread_keys=spread, interconnect=interconnect, bus_bandwidth_gbs=round(bandwidth, 1),
                    profile=profile.name, reasons=tuple(reasons))


def _why(subset: TopologyTree, request: PlacementRequest, scope: Member, domains: tuple[DomainRef, ...]) -> str:
    shape = f"{request.pods} pod(s) x {request.gpus_per_pod} GPU(s)"
    if request.strategy is Strategy.DISTRIBUTED:
        return f"{shape} spread over nodes and leaves of {scope.label} for failure isolation"
    if len(domains) > 1:
        return (f"{shape} in {scope.label} across {', '.join(d.name for d in domains)}: "
                f"no single {domains[0].level_name} holds them; fewest {domains[0].level_name}s, balanced")
    return (f"{shape} in {scope.label}: the tightest {scope.ref.level_name} that holds them "
            f"({scope.fits(request.gpus_per_pod)} such pod(s) fit there)")


# -- nothing fits now, or not on the nodes there are, or ever ---------------------------------------------

def _onto_growth(subset: TopologyTree, request: PlacementRequest, pools: Sequence[Pool]) -> Decision | None:
    """The nodes there are have no room for the request: the first pool (heaviest first) whose
    new nodes may take its pods and that has room to add them, as a WAIT steered to the pool's
    labels and kept inside one domain of the topology labels it fixes in advance; None if no
    pool takes it."""
    gpus, pods = request.gpus_per_pod, request.pods
    ceiling = None if request.max_domain is None else _ceiling_label(subset, request.max_domain)
    for pool in pools:
        if not pool.takes(request) or (request.max_domain is not None and ceiling not in pool.fixed
                                       and ceiling not in pool.choices and not (ceiling == HOSTNAME_LABEL and pods == 1)):
            continue  # a max-domain ceiling is kept only where the pool fixes that level in advance
        if not pool.room_for(request, 0) and not pool.room_for(request, sum(  # its nodes only when needed
                subset.nodes[name].fits(gpus) for name in pool.members if name in subset.nodes)):
            continue
        pins = _pool_pins(subset, request, pool)
        inside = ", ".join(f"{r.key}={r.values[0]}" for r in pins[1:])
        size = f" of {pool.gpus_per_node} GPUs" if pool.gpus_per_node is not None else ""
        room = f", {pool.room_nodes} more at most" if pool.room_nodes is not None else ""
        reason = (f"{request.workload} needs {pods} pod(s) x {gpus} GPU(s); the nodes it may use hold "
                  f"{subset.root.fits(gpus)} such pod(s) now, {subset.root.fits_idle(gpus)} when idle; {pool} can add "
                  f"nodes{size}{room}: steered to it" + (f", inside {inside}" if inside else ""))
        return Decision(Outcome.WAIT, request, DomainRef(-1, pool.kind, (pool.identity,)), requirements=pins,
                        code=GROWS_POOL, reasons=(reason,))
    return None


def _ceiling_label(subset: TopologyTree, max_domain: str) -> str | None:
    """The node label of a max-domain level (hostname for `node`); None when it names no level."""
    labels = {lv.name: lv.label for lv in subset.config.levels} | {lv.label: lv.label for lv in subset.config.levels}
    return (labels | {"node": HOSTNAME_LABEL, HOSTNAME_LABEL: HOSTNAME_LABEL}).get(max_domain.strip())


def _invalid_domain(index: TopologyTree, subset: TopologyTree, request: PlacementRequest) -> Decision | None:
    """The denial of a preferred-domain or max-domain that names nothing: invalid input, whatever
    the capacity."""
    if request.preferred_domain:
        found = _resolve(index, subset, request.preferred_domain)
        if isinstance(found, str):
            return Decision(Outcome.NEVER, request, None, code=UNKNOWN_DOMAIN, reasons=(found,))
    if request.max_domain is not None and _ceiling_label(subset, request.max_domain) is None:
        ceiling = _max_level(subset, request)
        return ceiling if isinstance(ceiling, Decision) else None
    return None


def _pool_pins(subset: TopologyTree, request: PlacementRequest, pool: Pool) -> tuple[NodeRequirement, ...]:
    """The pool's identity, then each topology label it fixes in advance, and for one it leaves
    open (several zones) the first value the request's own constraints allow: a group stays in
    one domain. A distributed workload is spread for failure isolation: only its identity."""
    pins = [NodeRequirement(pool.identity[0], (pool.identity[1],))]
    if request.strategy is Strategy.DISTRIBUTED and not request.latency_sensitive:
        return tuple(pins)
    for key in dict.fromkeys((*TOPOLOGY_IN_ADVANCE, *(lv.label for lv in subset.config.levels))):
        if key == pool.identity[0]:
            continue
        if key in pool.fixed:
            pins.append(NodeRequirement(key, (pool.fixed[key],)))
            continue
        allowed = [v for v in pool.choices.get(key, ()) if _request_allows(request, key, v)]
        if allowed:
            pins.append(NodeRequirement(key, (allowed[0],)))
    return tuple(pins)


def _request_allows(request: PlacementRequest, key: str, value: str) -> bool:
    """Whether the request's own nodeSelector and some required term allow `key=value`."""
    if request.node_selector.get(key, value) != value:
        return False
    return not request.required_node_terms or any(
        all(expression_matches(e, {key: value}) for e in term.get("matchExpressions") or () if e.get("key") == key)
        for term in request.required_node_terms)


def _beyond_the_nodes(index: TopologyTree, subset: TopologyTree, request: PlacementRequest) -> Decision:
    """The nodes the request may use cannot hold it even when idle. Kubernetes keeps such pods
    Pending until nodes are added, so this is a WAIT pinned to nothing (a pin on the labels of the
    nodes there are would keep the new ones out). NEVER when no node could take even one pod by
    its size (no node type it may use is large enough), when a max-domain ceiling no domain holds,
    and for every case with `refuse_unplaceable` (a cluster that never grows)."""
    gpus, pods = request.gpus_per_pod, request.pods
    shape = f"{pods} pod(s) x {gpus} GPU(s)"
    if subset.root.fits_idle(1) == 0:
        refused_code = waiting_code = NO_MATCHING_NODES
        reason = f"no GPU node is open to {request.workload}: " + _exclusions(index, request)
        too_large = _no_node_holds_one_pod(index, request)
    else:
        ceiling = _max_level(subset, request)
        if isinstance(ceiling, Decision):
            return ceiling
        refused_code, waiting_code = EXCEEDS_CLUSTER, EXCEEDS_NODES
        largest = max((n.alloc for n in subset.nodes.values()), default=0)
        reason = (f"{request.workload} needs {shape}; even with every GPU free the nodes it may use hold "
                  f"{subset.root.fits_idle(gpus)} such pod(s) (largest node: {largest} GPUs)")
        too_large = subset.root.fits_idle(gpus) == 0
    if too_large or subset.config.refuse_unplaceable:
        why = f"; no node it may use takes a pod of {gpus} GPU(s)" if too_large else ""
        return Decision(Outcome.NEVER, request, None, code=refused_code, reasons=(reason + why,))
    reasons = [f"{reason}; it waits for nodes to be added"]
    reasons.extend(_out_of_service(subset))
    reasons.extend(_per_level(subset, pods, lambda d: d.fits_idle(gpus), " when idle"))
    return Decision(Outcome.WAIT, request, None, code=waiting_code, reasons=tuple(reasons))


def _no_node_holds_one_pod(index: TopologyTree, request: PlacementRequest) -> bool:
    """Whether no GPU node of the cluster, whatever its labels and taints, could take one pod by
    its size: its GPUs, and the other resources it requests. False when the cluster has no GPU
    node at all: then there is no node type to judge by. The slow path only (a scan)."""
    gpus = request.gpus_per_pod
    if index.root.fits_idle(1) == 0:
        return False
    if index.root.fits_idle(gpus) == 0:
        return True
    return bool(request.resources) and not any(
        node.alloc >= gpus and all(node.allocatable.get(name, 0) >= amount for name, amount in request.resources)
        for node in index.nodes.values())


def _out_of_service(subset: TopologyTree) -> list[str]:
    if not subset.out_of_service:
        return []
    out = sorted(subset.out_of_service.items())
    return [f"{len(out)} GPU node(s) out of service for now may return: " + ", ".join(
        f"{name} ({why})" for name, why in out[:5]) + (", ..." if len(out) > 5 else "")]


def _per_level(subset: TopologyTree, pods: int, fitting: Callable[[Domain], int], when: str = "") -> list[str]:
    """Per level, narrowest first, the three domains where the most pods fit, and how many."""
    lines = []
    for level in range(len(subset.levels) - 1, -1, -1):
        ranked = heapq.nsmallest(3, subset.levels[level].values(), key=lambda d: (-fitting(d), d.path))
        if ranked:
            lines.append(f"{subset.config.levels[level].name}: " + ", ".join(
                f"{d.ref.name} {min(fitting(d), pods)} of {pods} pods fit{when}" for d in ranked))
    return lines


def _waiting(subset: TopologyTree, request: PlacementRequest, chain: list[Member]) -> Decision:
    """Name the domain that will fit first: the deepest level with a domain that could ever hold
    the workload, and in it the domain closest to fitting now; say per level how much fits."""
    gpus, pods = request.gpus_per_pod, request.pods
    target: Member | None = None
    for scope in chain:
        target = _node_first_to_fit(scope, gpus, pods)
        if target is not None:
            break
        for level in range(len(subset.levels) - 1, scope.ref.level, -1):
            able = [d for d in _at_level(scope, level) if d.fits_idle(gpus) >= pods]
            if able:
                target = min(able, key=lambda d: (-d.fits(gpus), -d.freeing, -d.free_gpus, d.path))
                break
        if target is not None:
            break
        if scope.fits_idle(gpus) >= pods:
            target = scope
            break
    target = target or subset.root
    freeing = f", {target.freeing} GPU(s) there being freed by terminating pods" if target.freeing else ""
    reasons = [f"no domain has room for {pods} pod(s) x {gpus} GPU(s) now; {target.label} will fit first "
               f"({target.fits(gpus)} of {pods} fit now, {target.fits_idle(gpus)} when idle{freeing})"]
    reasons.extend(_out_of_service(subset))
    reasons.extend(_per_level(subset, pods, lambda d: d.fits(gpus)))
    return Decision(Outcome.WAIT, request, target.ref, domains=(target.ref,),
                    requirements=_requirements(subset, target), code=NO_ROOM_NOW, reasons=tuple(reasons))


def _node_first_to_fit(scope: Member, gpus: int, pods: int) -> NodeState | None:
    """The node under `scope` that holds all `pods` once idle and is closest to fitting now: the
    most pods fitting, then the most GPUs once terminating pods are gone, then the most free GPUs,
    then the first by rack and name. None if no node could ever hold them.

    Best first, not a scan of every node: a domain's priority, from its freest node and every GPU
    being freed beneath it, is never worse than that of a node beneath it, so the first node taken
    off the heap is the answer, and a wait on a full cluster looks at the domains on the way to it."""
    need = gpus * pods  # a node holds all pods once idle iff alloc >= need: ever[need] > 0 below
    if not scope.fits_idle(need):
        return None
    if isinstance(scope, NodeState):
        return scope  # a preferred node
    # Priorities are unique (paths and node names are), so members themselves are never compared.
    heap: list[tuple[tuple[int, ...], tuple, str, Member]] = [(_node_bound(scope, gpus), scope.path, "", scope)]
    while heap:
        member = heapq.heappop(heap)[-1]
        if isinstance(member, NodeState):
            return member
        for child in member.children.values():
            if not child.fits_idle(need):
                continue
            if isinstance(child, Domain):
                heapq.heappush(heap, (_node_bound(child, gpus), child.path, "", child))
            else:
                heapq.heappush(heap, (_wait_key(child.free, child.freeing, gpus), member.path, child.name, child))
    return None


def _node_bound(domain: Domain, gpus: int) -> tuple[int, int, int]:
    """The best key any node below could have: its freest node's, with all GPUs being freed below."""
    hist = domain.free_hist
    top = len(hist) - 1
    while top and not hist[top]:
        top -= 1
    return _wait_key(top, domain.freeing, gpus)


def _wait_key(free: int, freeing: int, gpus: int) -> tuple[int, int, int]:
    """Closest to fitting first: pods fitting now, then once terminating pods are gone, then free GPUs."""
    return -(free // gpus), -((free + freeing) // gpus), -free


def _exclusions(index: TopologyTree, request: PlacementRequest) -> str:
    """Why nodes were left out, counted per cause in a stable order (the slow path only)."""
    causes: dict[str, int] = {}
    for node in index.nodes.values():
        if node.alloc <= 0:
            cause = "no GPUs"
        elif any(not tolerates(request.tolerations, t) for t in node.taints):
            cause = "untolerated taint"
        elif not node_matches(node, request):
            cause = "nodeSelector, affinity or network-bandwidth"
        else:
            continue
        causes[cause] = causes.get(cause, 0) + 1
    counted = "; ".join(f"{cause}: {n}" for cause, n in sorted(causes.items()))
    return f"{len(index.nodes)} node(s), excluded by {counted or 'nothing'}"
