"""The placement core: a pure decision, with its reasons, from a cluster index and a request.

Consolidated (and balanced, which only changes how the mutation enforces it):
  1. Find the tightest domain that holds every pod whole, deepest level first: a node, then a
     leaf, a spine, a zone, the cluster. Among domains of that level take the best fit (the least
     capacity that still fits), so whole leaves and whole NVLink domains stay free for big jobs.
     A preferred domain is searched first, then its ancestors outwards (nearest by topology).
  2. Split the pods over that domain's children: the fewest children that hold them, a level at
     a time with the children of every domain taken pooled (Kueue's BestFit descent), down to
     nodes, where the shares are balanced (4+4 beats 1+7: the smallest share on a node sets the
     bandwidth).
  3. Per pod, pick an NVLink-aligned GPU set on its node (the smallest NVLink domain that holds it).
Distributed: one pod per node where possible, round-robin over leaves for failure isolation;
latency-sensitive workloads stay inside one domain of the level above the leaves.
Nothing fits now: the domain at the deepest level that could ever hold it and is closest to fitting
is named, with how much fits per level. The nodes there are cannot hold it even idle: it waits for
nodes to be added, pinned to nothing. No node could take even one of its pods: said plainly.

Here: the decision, consolidated and distributed (the strategy's registered layout), and a placed
decision built. Beside it: `walk` (reading the tree, the domains a request names, the pin a
decision writes), `waiting` (when nothing fits now), `estimate` (the bandwidth a placement gets),
and the tree's `orderings` (every sort key, core/orderings.py).
"""
from __future__ import annotations

import dataclasses
import heapq
import math
from typing import Callable, Sequence

from ..core.model import UNKNOWN_DOMAIN, Decision, DomainRef, Interconnect, NodeAssignment, Outcome, PlacementRequest
from ..core.orderings import Orderings
from ..core.strategies import Layout
from ..settings.presets import HOSTNAME_LABEL
from ..state.growth import Pool
from ..state.tree import NodeState, TopologyTree
from . import estimate, waiting, walk
from .enforce import enforced
from .tighter import held_for_tighter
from .walk import Member


def decide(tree: TopologyTree, request: PlacementRequest, subset: TopologyTree,
           pools: Callable[[], Sequence[Pool]] = tuple) -> Decision:
    """The decision for `request`, reading the whole `tree` and `subset`, the part of it the
    request may use (`ClusterIndex.restricted_to`: the whole tree when nothing filters), with its
    best-fit orders caught up for the request's pod size, and, when the nodes there are have no
    room for it, the `pools` that can add nodes (read only then), carrying how it is held
    (enforce.py). Pure: it takes no lock and writes nothing; the caller holds the index still
    while it runs."""
    return enforced(_decision(tree, request, subset, pools), tree.config)


def _decision(tree: TopologyTree, request: PlacementRequest, subset: TopologyTree,
              pools: Callable[[], Sequence[Pool]]) -> Decision:
    gpus, pods = request.gpus_per_pod, request.pods
    if gpus < 1 or pods < 1:
        raise ValueError(f"a placement needs at least one pod and one GPU per pod, got {pods} x {gpus}")
    shape = f"{pods} pod(s) x {gpus} GPU(s)"
    if subset.root.fits_idle(gpus) < pods:
        return (waiting.invalid_domain(tree, subset, request) or waiting.onto_growth(subset, request, pools())
                or waiting.beyond_the_nodes(tree, subset, request))
    narrowest = walk.max_level(subset, request)
    if isinstance(narrowest, Decision):
        return narrowest
    chain: list[Member] = [subset.root]
    preferred: Member | None = None
    if request.preferred_domain:
        found = walk.resolve(tree, subset, request.preferred_domain)
        if isinstance(found, str):
            return Decision(Outcome.NEVER, request, None, code=UNKNOWN_DOMAIN, reasons=(found,))
        preferred = found
        chain = walk.ancestry(preferred)
    if request.strategy.rules.layout is Layout.SPREAD:
        decision = _distributed(subset, request, chain, narrowest)
    else:
        decision = _consolidated(subset, request, _searched_first(subset, request) or chain, chain, narrowest)
    if decision.outcome is Outcome.WAIT:  # added nodes may take it sooner than running work ends
        decision = waiting.onto_growth(subset, request, pools()) or decision
    elif decision.outcome is Outcome.PLACED:  # not onto growth: it waits for room a tighter domain has
        decision = held_for_tighter(subset, request, chain, decision, narrowest)
    if preferred is None or decision.outcome is not Outcome.PLACED:
        return decision
    honoured = decision.scope is not None and walk.is_under(decision.scope.path, preferred.path)
    note = (f"preferred {preferred.label} honoured" if honoured else
            f"preferred {preferred.label} cannot hold {shape} now ({preferred.fits_now(gpus)} fit); "
            f"nearest domain with room by topology: {decision.scope}")
    return dataclasses.replace(decision, preferred_honoured=honoured, reasons=(note,) + decision.reasons)


def _searched_first(subset: TopologyTree, request: PlacementRequest) -> list[Member] | None:
    """The domain a consolidated or balanced placement searches first (`search_first`), then its
    ancestors outwards; None beside a preferred domain, or when the subset lacks it. Only where to
    look first: a distributed spread and a wait (where it waits, what it is pinned to) ignore it."""
    if request.preferred_domain or not request.search_first:
        return None
    first = walk.lookup(subset, request.search_first)
    return walk.ancestry(first) if first is not None else None


def _consolidated(subset: TopologyTree, request: PlacementRequest, search: list[Member], chain: list[Member],
                  narrowest: int) -> Decision:
    """Placed in the first scope of `search` that holds it, else waiting as `chain` says."""
    gpus, pods = request.gpus_per_pod, request.pods
    for searched, scope in enumerate(search, start=1):
        target = _tightest_fit(subset, scope, pods, gpus)
        if target is not None and target.ref.level >= narrowest:  # never wider than max-domain
            placed = _placed(subset, request, target, _split(target, pods, gpus, subset.orderings))
            return _nics_filled(subset, request, search[:searched], target.ref.level, placed) or placed
    return waiting.wait_decision(subset, request, chain, narrowest)


def _nics_filled(subset: TopologyTree, request: PlacementRequest, search: list[Member], level: int,
                 placed: Decision) -> Decision | None:
    """The same pods in groups that fill their nodes' NICs, where that gives a higher estimated bus
    bandwidth than `placed`, found in `search` (the scopes searched up to the one `placed` is in,
    so a preferred domain it honours is honoured) in a domain of `level` or deeper (no wider than
    `placed`, as a gated wait's release requires); None otherwise.

    A ring's NIC bandwidth is set by the node holding the fewest of its GPUs (estimate.py), so a
    multi-node job of pods smaller than a node's NICs that fills 4-GPU holes one pod each runs its
    whole ring at half speed. Placing it as groups of pods, each group as many GPUs as a node has
    NICs, takes whole-enough nodes instead, where some are free: only the last group may be short.
    Taken only when the estimate says so."""
    if not subset.config.fill_nics:
        return None
    gpus, pods = request.gpus_per_pod, request.pods
    node = subset.nodes[placed.assignment[0].node]
    per_group = min(max(1, node.profile.nics_per_node // gpus), max(1, node.gpus // gpus))
    groups = math.ceil(pods / per_group)
    if per_group == 1 or groups == 1 or len(placed.assignment) <= groups:
        return None  # pods that fill the NICs alone, one node's worth, or already on the fewest nodes
    for scope in search:
        target = _tightest_fit(subset, scope, groups, per_group * gpus)
        if target is not None and target.ref.level >= level:
            split = [(n, count * per_group) for n, count in _split(target, groups, per_group * gpus, subset.orderings)]
            short = groups * per_group - pods  # the last group's missing pods, off the last node
            split[-1] = (split[-1][0], split[-1][1] - short)
            filled = _placed(subset, request, target, split)
            if (filled.bus_bandwidth_gbs or 0.0) <= (placed.bus_bandwidth_gbs or 0.0):
                return None
            why = (f"{per_group} pods per node, filling its {node.profile.nics_per_node} NICs: the node with the "
                   f"fewest of a job's GPUs sets its ring's NIC bandwidth ({placed.bus_bandwidth_gbs:.0f} GB/s over "
                   f"{len(placed.assignment)} nodes of {placed.scope})")
            return dataclasses.replace(filled, reasons=(filled.reasons[0], why, *filled.reasons[1:]))
    return None


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
        fitting = [d for d in walk.at_level(scope, level) if d.fits_now(gpus) >= pods]
        if fitting:
            return min(fitting, key=lambda d: subset.orderings.best_fit(d, gpus))
    return scope if scope.fits_now(gpus) >= pods else None


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
            return min(walk.as_nodes(kids), key=lambda n: subset.orderings.aligned_first(n, gpus))
        member = min(kids, key=lambda d: subset.orderings.with_small_jobs_first(d, gpus))
    return walk.as_node(member)


def _split(member: Member, pods: int, gpus: int, keys: Orderings) -> list[tuple[NodeState, int]]:
    """Pods per node under `member`, over the fewest domains at each level below it.

    Across switches the split does not change the estimate (every node brings its own NICs;
    crossing costs the same), so a level at a time, as Kueue's BestFit descends: the children of
    every domain taken above are pooled, the roomiest filled first and the rest given to the
    tightest that holds it, which leaves the fewest partly used leaves behind. Pooled, a spine
    taken whole does not take its scattered racks: only the fewest racks of the spines taken.
    Across nodes the shares are balanced: the node with the fewest of the job's GPUs sets its
    NIC bandwidth, so 4+4 beats 1+7."""
    if not member.children:
        return [(walk.as_node(member), pods)]
    taken: list[Member] = [member]
    while True:
        kids = sorted((c for parent in taken for c in parent.children.values() if c.fits_now(gpus) > 0),
                      key=lambda c: keys.roomiest_child(c, gpus))
        if not kids[0].children:  # across nodes
            chosen, shares = _balanced(kids, pods, gpus, keys)
            return [(walk.as_node(kid), n) for kid, n in zip(chosen, shares) if n]
        taken = _roomiest_then_tightest(kids, pods, gpus, keys)


def _fewest(kids: list[Member], pods: int, gpus: int) -> int:
    """How many of `kids` (roomiest first) it takes to hold the pods."""
    total = 0
    for count, kid in enumerate(kids, start=1):
        total += kid.fits_now(gpus)
        if total >= pods:
            return count
    return len(kids)


def _balanced(kids: list[Member], pods: int, gpus: int, keys: Orderings) -> tuple[list[Member], list[int]]:
    count = _fewest(kids, pods, gpus)
    share = math.ceil(pods / count)
    even = [c for c in kids if c.fits_now(gpus) >= share]
    if len(even) >= count:  # best fit among the children that can take an even share
        chosen = sorted(even, key=lambda c: keys.even_share_fit(c, gpus))[:count]
        return chosen, [pods // count + (1 if i < pods % count else 0) for i in range(count)]
    # Uneven capacities: water-fill from the smallest so the minimum share is as large as possible.
    chosen = sorted(kids[:count], key=lambda c: keys.smallest_first(c, gpus))
    shares, left = [], pods
    for i, kid in enumerate(chosen):
        give = min(kid.fits_now(gpus), math.ceil(left / (count - i)))
        shares.append(give)
        left -= give
    return chosen, shares


def _roomiest_then_tightest(kids: list[Member], pods: int, gpus: int, keys: Orderings) -> list[Member]:
    """The fewest of `kids` (roomiest first) that hold the pods, the last the tightest that holds the rest."""
    chosen: list[Member] = []
    left = pods
    for i, kid in enumerate(kids):
        if kid.fits_now(gpus) >= left:  # the rest fits in one child: the tightest that holds it
            return chosen + [min(kids[i:], key=lambda c: keys.tightest_for_rest(c, gpus, left))]
        chosen.append(kid)
        left -= kid.fits_now(gpus)
    return chosen


def _distributed(subset: TopologyTree, request: PlacementRequest, chain: list[Member], narrowest: int) -> Decision:
    gpus, pods = request.gpus_per_pod, request.pods
    depth = len(subset.levels)
    scope: Member | None = None
    if request.latency_sensitive and depth >= 1:
        # Short hops: the tightest domain of the level above the leaves that holds every pod
        # (one per node if it can), nearest the preferred domain; wider levels only if none does.
        for anchor in chain:
            for level in range(max(0, depth - 2), -1, -1):
                fitting = [d for d in walk.members_at(anchor, level) if d.fits_now(gpus) >= pods]
                if fitting:
                    scope = min(fitting, key=lambda d: subset.orderings.one_pod_per_node_fit(d, gpus, pods))
                    break
            if scope is not None:
                break
        scope = scope or (subset.root if subset.root.fits_now(gpus) >= pods else None)
    else:
        scope = next((m for m in chain if m.fits_now(gpus) >= pods), None)
    if scope is not None and scope.ref.level < narrowest:  # max-domain: the roomiest domain of that level
        fitting = [d for anchor in chain for d in walk.members_at(anchor, narrowest) if d.fits_now(gpus) >= pods]
        scope = min(fitting, key=lambda d: subset.orderings.widest_spread(d, gpus)) if fitting else None
    if scope is None:
        return waiting.wait_decision(subset, request, chain)
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
        open_leaves = [d for d in walk.at_level(scope, depth - 1) if d.slots(gpus)]
        groups = heapq.nsmallest(pods, open_leaves, key=lambda d: subset.orderings.roomiest(d, gpus))
    else:
        groups = [scope]
    queues = [sorted(walk.nodes_fitting(g, gpus), key=subset.orderings.tightest_node) for g in groups]
    used: dict[str, int] = {}
    taken = [0] * len(groups)
    for _ in range(pods):
        open_groups = [i for i in range(len(groups)) if taken[i] < len(queues[i])]
        if not open_groups:
            break
        i = min(open_groups, key=lambda k: subset.orderings.round_robin(taken[k], len(queues[k]) - taken[k], k))
        used[queues[i][taken[i]].name] = 1
        taken[i] += 1
    left = pods - sum(used.values())
    while left:  # fewer open nodes than pods: stack onto the nodes with the most room left
        nodes = [n for n in walk.nodes_fitting(scope, gpus) if n.free >= gpus * (used.get(n.name, 0) + 1)]
        node = max(nodes, key=lambda n: subset.orderings.most_room_left(n, gpus, used.get(n.name, 0)))
        used[node.name] = used.get(node.name, 0) + 1
        left -= 1
    return used


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
    used_children = {walk.child_towards(node, scope).ref.name for node, _ in split
                     if scope.children and walk.child_towards(node, scope).children}
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
    confine = [node for node, _ in split] if request.strategy.rules.layout is not Layout.SPREAD else []
    named = sorted({walk.hostname(node) for node, _ in split})
    return Decision(Outcome.PLACED, request, scope.ref, domains=domains, assignment=tuple(assignment),
                    requirements=walk.requirements(subset, scope, confine) if pin else (),
                    held_nodes=tuple(named) if len(named) <= walk.MAX_NAMED_NODES else (),
                    spread_keys=spread, interconnect=interconnect, bus_bandwidth_gbs=round(bandwidth, 1),
                    profile=profile.name, reasons=tuple(reasons))


def _why(subset: TopologyTree, request: PlacementRequest, scope: Member, domains: tuple[DomainRef, ...]) -> str:
    shape = f"{request.pods} pod(s) x {request.gpus_per_pod} GPU(s)"
    if request.strategy.rules.layout is Layout.SPREAD:
        return f"{shape} spread over nodes and leaves of {scope.label} for failure isolation"
    if len(domains) > 1:
        return (f"{shape} in {scope.label} across {', '.join(d.name for d in domains)}: "
                f"no single {domains[0].level_name} holds them; fewest {domains[0].level_name}s, balanced")
    return (f"{shape} in {scope.label}: the tightest {scope.ref.level_name} that holds them "
            f"({scope.fits_now(request.gpus_per_pod)} such pod(s) fit there)")
