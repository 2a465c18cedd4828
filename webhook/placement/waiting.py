"""When nothing fits now: the domain that will fit first (a wait, pinned there or preferred), a node
pool that can grow to take it, or, when the nodes there are cannot hold it even idle, a wait pinned
to nothing; and the sentences that say why. Pure."""
from __future__ import annotations

import heapq
import math
from typing import Callable, Sequence

from ..core.model import EXCEEDS_CLUSTER, EXCEEDS_NODES, GROWS_POOL, NO_MATCHING_NODES, NO_ROOM_NOW, UNKNOWN_DOMAIN, Decision, DomainRef, NodeRequirement, Outcome, PlacementRequest
from ..core.strategies import Layout, Waits
from ..settings.presets import HOSTNAME_LABEL
from ..state.filters import expression_matches, node_matches, tolerates
from ..state.growth import TOPOLOGY_IN_ADVANCE, Pool
from ..state.tree import Domain, NodeState, TopologyTree
from . import estimate, walk
from .walk import Member


def onto_growth(subset: TopologyTree, request: PlacementRequest, pools: Sequence[Pool]) -> Decision | None:
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
                subset.nodes[name].fits_now(gpus) for name in pool.members if name in subset.nodes)):
            continue
        pins = _pool_pins(subset, request, pool)
        inside = ", ".join(f"{r.key}={r.values[0]}" for r in pins[1:])
        size = f" of {pool.gpus_per_node} GPUs" if pool.gpus_per_node is not None else ""
        room = f", {pool.room_nodes} more at most" if pool.room_nodes is not None else ""
        reason = (f"{request.workload} needs {pods} pod(s) x {gpus} GPU(s); the nodes it may use hold "
                  f"{subset.root.fits_now(gpus)} such pod(s) now, {subset.root.fits_idle(gpus)} when idle; {pool} can add "
                  f"nodes{size}{room}: steered to it" + (f", inside {inside}" if inside else ""))
        return Decision(Outcome.WAIT, request, DomainRef(-1, pool.kind, (pool.identity,)), requirements=pins,
                        code=GROWS_POOL, reasons=(reason,))
    return None


def _ceiling_label(subset: TopologyTree, max_domain: str) -> str | None:
    """The node label of a max-domain level (hostname for `node`); None when it names no level."""
    labels = {lv.name: lv.label for lv in subset.config.levels} | {lv.label: lv.label for lv in subset.config.levels}
    return (labels | {"node": HOSTNAME_LABEL, HOSTNAME_LABEL: HOSTNAME_LABEL}).get(max_domain.strip())


def invalid_domain(tree: TopologyTree, subset: TopologyTree, request: PlacementRequest) -> Decision | None:
    """The denial of a preferred-domain or max-domain that names nothing: invalid input, whatever
    the capacity."""
    if request.preferred_domain:
        found = walk.resolve(tree, subset, request.preferred_domain)
        if isinstance(found, str):
            return Decision(Outcome.NEVER, request, None, code=UNKNOWN_DOMAIN, reasons=(found,))
    if request.max_domain is not None and _ceiling_label(subset, request.max_domain) is None:
        ceiling = walk.max_level(subset, request)
        return ceiling if isinstance(ceiling, Decision) else None
    return None


def _pool_pins(subset: TopologyTree, request: PlacementRequest, pool: Pool) -> tuple[NodeRequirement, ...]:
    """The pool's identity, then each topology label it fixes in advance, and for one it leaves
    open (several zones) the first value the request's own constraints allow: a group stays in
    one domain. A distributed workload is spread for failure isolation: only its identity."""
    pins = [NodeRequirement(pool.identity[0], (pool.identity[1],))]
    if request.strategy.rules.layout is Layout.SPREAD and not request.latency_sensitive:
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


def beyond_the_nodes(tree: TopologyTree, subset: TopologyTree, request: PlacementRequest) -> Decision:
    """The nodes the request may use cannot hold it even when idle. Kubernetes keeps such pods
    Pending until nodes are added, so this is a WAIT pinned to nothing (a pin on the labels of the
    nodes there are would keep the new ones out). NEVER when no node could take even one pod by
    its size (no node type it may use is large enough), when a max-domain ceiling no domain holds,
    and for every case with `refuse_unplaceable` (a cluster that never grows)."""
    gpus, pods = request.gpus_per_pod, request.pods
    shape = f"{pods} pod(s) x {gpus} GPU(s)"
    if subset.root.fits_idle(1) == 0:
        refused_code = waiting_code = NO_MATCHING_NODES
        reason = f"no GPU node is open to {request.workload}: " + exclusions(tree, request)
        too_large = _no_node_holds_one_pod(tree, request)
    else:
        ceiling = walk.max_level(subset, request)
        if isinstance(ceiling, Decision):
            return ceiling
        refused_code, waiting_code = EXCEEDS_CLUSTER, EXCEEDS_NODES
        largest = max((n.gpus for n in subset.nodes.values()), default=0)
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


def _no_node_holds_one_pod(tree: TopologyTree, request: PlacementRequest) -> bool:
    """Whether no GPU node of the cluster, whatever its labels and taints, could take one pod by
    its size: its GPUs, and the other resources it requests. False when the cluster has no GPU
    node at all: then there is no node type to judge by. The slow path only (a scan)."""
    gpus = request.gpus_per_pod
    if tree.root.fits_idle(1) == 0:
        return False
    if tree.root.fits_idle(gpus) == 0:
        return True
    return bool(request.resources) and not any(
        node.gpus >= gpus and all(node.other_allocatable.get(name, 0) >= amount for name, amount in request.resources)
        for node in tree.nodes.values())


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


def wait_decision(subset: TopologyTree, request: PlacementRequest, chain: list[Member], narrowest: int = -1) -> Decision:
    """Name the domain that will fit first: the deepest level with a domain that could ever hold
    the workload, and in it the domain closest to fitting now; say per level how much fits. With
    `pin_only_where_locality_pays`, a consolidated or balanced wait names the domain worth
    waiting in (`_worth_waiting_in`), never wider than max-domain's level `narrowest`, and none
    (`Decision.locality_pays` false) where that is the whole cluster."""
    gpus, pods = request.gpus_per_pod, request.pods
    target: Member | None = None
    for scope in chain:
        target = _node_first_to_fit(scope, gpus, pods)
        if target is not None:
            break
        for level in range(len(subset.levels) - 1, scope.ref.level, -1):
            able = [d for d in walk.at_level(scope, level) if d.fits_idle(gpus) >= pods]
            if able:
                target = min(able, key=lambda d: subset.orderings.closest_to_fitting(d, gpus))
                break
        if target is not None:
            break
        if scope.fits_idle(gpus) >= pods:
            target = scope
            break
    target = target or subset.root
    freeing = f", {target.freeing} GPU(s) there being freed by terminating pods" if target.freeing else ""
    reasons = [f"no domain has room for {pods} pod(s) x {gpus} GPU(s) now; {target.label} will fit first "
               f"({target.fits_now(gpus)} of {pods} fit now, {target.fits_idle(gpus)} when idle{freeing})"]
    locality_pays = True
    waits = request.strategy.rules.waits
    weighed = waits is Waits.PINNED or (waits is Waits.PINNED_WHERE_IT_PAYS and request.may_pin_wait)
    if weighed and subset.config.pin_only_where_locality_pays:
        widest, why = _worth_waiting_in(subset, request, target, narrowest)
        if widest is subset.root:
            locality_pays = False  # the wait names where it fits first, as a preference
        else:
            target = widest
        if why:
            reasons.append(why)
    reasons.extend(_out_of_service(subset))
    reasons.extend(_per_level(subset, pods, lambda d: d.fits_now(gpus)))
    return Decision(Outcome.WAIT, request, target.ref, domains=(target.ref,), locality_pays=locality_pays,
                    requirements=walk.requirements(subset, target), code=NO_ROOM_NOW, reasons=tuple(reasons))


def _worth_waiting_in(subset: TopologyTree, request: PlacementRequest, target: Member, narrowest: int
                      ) -> tuple[Member, str]:
    """The widest domain around `target`, no wider than max-domain (`narrowest`), worth waiting in
    rather than `target` alone, a level at a time: one in which the cost model gives the request
    no less bandwidth (waiting for the narrower one would only delay it), or one whose expected
    wait is shorter by at least what the slower run costs (`_worth_spilling`). Greedy: it stops at
    the first level that does not pay. With the sentences that say so ("" when nothing was
    weighed and it is `target`)."""
    member, notes, start = target, [], None  # start: where the run of levels that cost nothing began
    node = first_node(target)  # the nodes are taken to be like it
    tight = estimate.bandwidth_across(subset, request, target.ref.level, node)
    while member.parent is not None and member.parent.ref.level >= narrowest:
        if estimate.spill_costs(subset, request, member.ref.level):
            worth, why = _worth_spilling(subset, request, (node, tight), member, member.parent)
            notes.append(why)
            start = None
            if not worth:
                break
        else:
            start = start or member
            same = f"the cost model gives it no less bandwidth anywhere in {member.parent.label} than in {start.label}"
            if start is not member:
                notes[-1] = same  # one sentence for a run of levels that cost nothing
            else:
                notes.append(same)
        member = member.parent
    if not notes:
        return target, ""
    if member is subset.root:
        why = "one pod runs alike on any node" if request.pods == 1 else "; ".join(notes)
        return member, f"{why}: the wait only prefers {target.label}, so it starts wherever room opens first"
    return member, "; ".join(notes) + f": it waits in {member.label}" + (
        "" if member is target else f" rather than for {target.label} alone")


def _worth_spilling(subset: TopologyTree, request: PlacementRequest, inside_target: tuple[NodeState, float],
                    member: Member, wider: Domain) -> tuple[bool, str]:
    """Whether the request should wait in `wider` rather than `member`, and the figures that say
    so: the wait it expects there is shorter by at least what spanning `wider` would stretch its
    run. Never when it expects no wait in `member` (the room its terminating pods free holds it:
    KAI's pipelining onto releasing GPUs): nothing wider is sooner, and a wider pin would only let
    the pods split. Both in run times, the unit the webhook can reason in without knowing any: a run is
    stretched by `communication_share` times how much lower the bandwidth is than the bandwidth
    `tight` inside the target, on nodes like `node` (`inside_target`: the first by name at every level)."""
    share = subset.config.communication_share
    node, tight = inside_target
    stretch = share * tight * (1 / estimate.bandwidth_across(subset, request, wider.ref.level, node)
                               - 1 / estimate.bandwidth_across(subset, request, member.ref.level, node))
    here, there = (expected_wait(m, request.gpus_per_pod, request.pods) for m in (member, wider))
    worth = here > 0 and here - there >= stretch
    return worth, (f"waiting for room in {member.label} is expected to take {here:.2f} run times, in "
                   f"{wider.label} {there:.2f}, and spanning it stretches the run by at most {stretch:.2f} "
                   f"(communication share {share:g}), so spilling {'pays' if worth else 'does not pay'}")


def expected_wait(member: Member, gpus: int, pods: int) -> float:
    """How long until `member` holds `pods` pods of `gpus`, in mean run times (infinite when it
    never can). A place for one pod that is taken frees when the work in it ends, and nothing says
    when: each is taken to end after an exponential time of mean one run, independently
    (memoryless), so the k-th of n frees after H(n) - H(n-k). Places being freed by terminating
    pods count as free; places on nodes out of service count as taken (they may return)."""
    now = member.fits_now(gpus)
    ever = member.fits_idle(gpus)
    if ever < pods:
        return math.inf
    soon = min(ever, now + member.freeing // gpus)
    short, taken = pods - soon, ever - soon
    if short <= 0:
        return 0.0
    return _harmonic(taken) - _harmonic(taken - short)


def _harmonic(n: int) -> float:
    """H(n) = 1 + 1/2 + ... + 1/n; the asymptotic series past 16 terms (error below 1e-9)."""
    if n <= 16:
        return sum(1 / k for k in range(1, n + 1))
    return math.log(n) + 0.5772156649015329 + 1 / (2 * n) - 1 / (12 * n ** 2) + 1 / (120 * n ** 4)


def first_node(member: Member) -> NodeState:
    """The node the estimates take every node under `member` to be like: the first by name at every level."""
    while not isinstance(member, NodeState):
        member = member.children[min(member.children)]
    return member


def _node_first_to_fit(scope: Member, gpus: int, pods: int) -> NodeState | None:
    """The node under `scope` that holds all `pods` once idle and is closest to fitting now: the
    most pods fitting, then the most GPUs once terminating pods are gone, then the most free GPUs,
    then the first by rack and name. None if no node could ever hold them.

    Best first, not a scan of every node: a domain's priority, from its freest node and every GPU
    being freed beneath it, is never worse than that of a node beneath it, so the first node taken
    off the heap is the answer, and a wait on a full cluster looks at the domains on the way to it."""
    need = gpus * pods  # a node holds all pods once idle iff its gpus >= need: pods_idle[need] > 0 below
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
    return _wait_key(domain.most_free, domain.freeing, gpus)


def _wait_key(free: int, freeing: int, gpus: int) -> tuple[int, int, int]:
    """Closest to fitting first: pods fitting now, then once terminating pods are gone, then free GPUs."""
    return -(free // gpus), -((free + freeing) // gpus), -free


def exclusions(tree: TopologyTree, request: PlacementRequest) -> str:
    """Why nodes were left out, counted per cause in a stable order (the slow path only)."""
    causes: dict[str, int] = {}
    for node in tree.nodes.values():
        if node.gpus <= 0:
            cause = "no GPUs"
        elif any(not tolerates(request.tolerations, t) for t in node.taints):
            cause = "untolerated taint"
        elif not node_matches(node, request):
            cause = "nodeSelector, affinity or network-bandwidth"
        else:
            continue
        causes[cause] = causes.get(cause, 0) + 1
    counted = "; ".join(f"{cause}: {n}" for cause, n in sorted(causes.items()))
    return f"{len(tree.nodes)} node(s), excluded by {counted or 'nothing'}"
