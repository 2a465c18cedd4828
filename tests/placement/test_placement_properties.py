"""Property tests: the placement core against a brute-force oracle on small clusters."""
import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fixtures.builders import gpu_job, subject_of
from webhook.objects.kinds import BY_KEY
from webhook.objects.feed import index_of
from webhook.objects import feed
from webhook.objects import mutation, workload
from webhook.state.filters import node_matches
from webhook.settings.config import Config
from webhook.kube.demo import make_allocated_claim, make_node, make_pod, make_resource_slice
from webhook.core.model import Hold, Outcome, PlacementRequest, Strategy
from webhook.placement.placer import place

LEVELS = ("topology.kubernetes.io/zone", "topology.scheduler/spine", "topology.scheduler/leaf")


@st.composite
def clusters(draw):
    """Nodes (name, path of label values, GPUs, GPUs in use) of a random small zone/spine/leaf tree.
    A node named d... has its GPUs through DRA (a ResourceSlice, its GPUs in use allocated in a
    ResourceClaim), one named n... through the device plugin (allocatable, pods)."""
    nodes = []
    for z in range(draw(st.integers(1, 2))):
        for s in range(draw(st.integers(1, 2))):
            for lf in range(draw(st.integers(1, 3))):
                for n in range(draw(st.integers(1, 3))):
                    gpus = draw(st.sampled_from([4, 8]))
                    source = draw(st.sampled_from("nd"))
                    nodes.append((f"{source}{z}{s}{lf}{n}", (f"z{z}", f"s{z}{s}", f"l{z}{s}{lf}"), gpus,
                                  draw(st.integers(0, gpus))))
    return nodes


def gpu_node(name: str, labels: dict, gpus: int) -> list[dict]:
    """The objects that give node `name` its GPUs: a Node, and under DRA its ResourceSlice."""
    if name.startswith("d"):
        return [make_node(name, labels, gpus, dra=True), make_resource_slice(name, gpus)]
    return [make_node(name, labels, gpus)]


def in_use(name: str, used: int) -> dict:
    """What takes `used` GPUs of node `name`: a pod, or under DRA an allocated claim."""
    if name.startswith("d"):
        return make_allocated_claim(f"use-{name}", name, [f"gpu-{g}" for g in range(used)])
    return make_pod(f"use-{name}", name, used)


def build(nodes, config=Config()):
    objs = [obj for name, path, gpus, _ in nodes for obj in gpu_node(name, dict(zip(LEVELS, path)), gpus)]
    return index_of(config, objs, [in_use(name, used) for name, _, _, used in nodes if used])


def oracle_levels(nodes, pods, gpus):
    """For each depth (3 = node, 2 = leaf, 1 = spine, 0 = zone, -1 = cluster): pods that fit in
    the roomiest single domain, counting every pod whole on one node."""
    best = {}
    for depth in range(-1, 4):
        groups = {}
        for name, path, _, used in nodes:
            key = (path + (name,))[: depth + 1]
            free = [n for n in nodes if n[0] == name][0]
            groups[key] = groups.get(key, 0) + (free[2] - free[3]) // gpus
        best[depth] = groups
    return best


requests = st.tuples(st.integers(1, 6), st.sampled_from([1, 2, 4, 8]))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters(), requests, st.booleans())
def test_consolidated_matches_the_oracle(nodes, shape, refuse_unplaceable):
    """The tightest domain and its split (`fill_nics`, off by default, may choose otherwise: below)."""
    pods, gpus = shape
    index = build(nodes, Config(refuse_unplaceable=refuse_unplaceable))
    decision = place(index, PlacementRequest("Job p/x", pods, gpus, Strategy.CONSOLIDATED))
    groups = oracle_levels(nodes, pods, gpus)
    free = {name: gpus_ - used for name, _, gpus_, used in nodes}
    idle_fit = sum(g // gpus for _, _, g, _ in nodes)
    if idle_fit < pods:  # only nodes added later could hold it: it waits for them, pinned to none of these
        never = refuse_unplaceable or idle_fit == 0
        assert decision.outcome is (Outcome.NEVER if never else Outcome.WAIT)
        assert decision.requirements == ()
        return
    if groups[-1][()] < pods:
        assert decision.outcome is Outcome.WAIT
        return
    assert decision.outcome is Outcome.PLACED
    # Never over-commit a node, and place exactly the pods asked for.
    assert sum(a.pods for a in decision.assignment) == pods
    for a in decision.assignment:
        assert a.pods * gpus <= free[a.node]
        assert all(len(ids) == gpus and len(set(ids)) == gpus for ids in a.gpu_ids)
    # The deepest level at which one domain holds everything is the level chosen...
    deepest = max(d for d in range(-1, 4) if any(c >= pods for c in groups[d].values()))
    assert decision.scope.level == deepest
    # ...never a domain with less room than the request, and the tightest such domain.
    key = tuple(v for _, v in decision.scope.path)[: deepest + 1] if deepest < 3 else None
    if key is not None:
        fitting = [c for c in groups[deepest].values() if c >= pods]
        assert groups[deepest][key] >= pods
        assert groups[deepest][key] == min(fitting)
    # Span: the fewest children of the scope that can hold the pods.
    if 0 <= deepest + 1 <= 3 and deepest < 3:
        children = sorted((c for k, c in groups[deepest + 1].items() if k[: deepest + 1] == key), reverse=True)
        needed = next(i + 1 for i in range(len(children)) if sum(children[: i + 1]) >= pods)
        used_children = {(tuple(p for p in path) + (a.node,))[: deepest + 2]
                         for a in decision.assignment for name, path, _, _ in nodes if name == a.node}
        assert len(used_children) == needed


@st.composite
def half_used_clusters(draw):
    """Clusters whose nodes are idle, half used or full: holes the size of half a node, where pods
    smaller than a node's NICs would otherwise go one each."""
    return [(name, path, gpus, draw(st.sampled_from([0, gpus // 2, gpus]))) for name, path, gpus, _ in draw(clusters())]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(clusters(), half_used_clusters()), st.tuples(st.integers(2, 8), st.sampled_from([1, 2, 4])))
def test_pods_smaller_than_a_nodes_nics_are_grouped_only_where_the_estimate_gains(nodes, shape):
    """With `fill_nics` a consolidated decision is the one without it, or the same pods in groups
    that fill a node's NICs (only the last short) with a higher estimated bus bandwidth; never an
    over-committed node, a wait, or another outcome."""
    pods, gpus = shape
    request = PlacementRequest("Job p/x", pods, gpus, Strategy.CONSOLIDATED)
    plain = place(build(nodes), request)
    decision = place(build(nodes, Config(fill_nics=True)), request)
    if decision == plain:
        return
    assert plain.outcome is decision.outcome is Outcome.PLACED
    assert decision.bus_bandwidth_gbs > plain.bus_bandwidth_gbs
    assert len(decision.assignment) < len(plain.assignment)
    assert decision.scope.level >= plain.scope.level  # no wider (a gated wait's release needs that)
    assert "pods per node, filling its 8 NICs" in decision.reasons[1]
    free = {name: total - used for name, _, total, used in nodes}
    assert sum(a.pods for a in decision.assignment) == pods
    assert all(a.pods * gpus <= free[a.node] for a in decision.assignment)
    first = build(nodes).nodes[plain.assignment[0].node]  # the group's size is read from its node
    per_group = min(first.profile.nics_per_node // gpus, first.gpus // gpus)
    assert sum(1 for a in decision.assignment if a.pods % per_group) <= 1  # only the last group short


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters(), requests, st.sets(st.integers(0, 40)), st.sets(st.integers(0, 40)))
def test_the_emitted_pod_spec_allows_exactly_the_lowest_domains_a_consolidated_decision_uses(
        nodes, shape, rackless, renamed):
    """Nodes may lack their rack label (alone there) or have a hostname label unlike their name."""
    pods, gpus = shape
    objs = []
    for i, (name, path, total, _) in enumerate(nodes):
        labels = dict(zip(LEVELS, path[:2] if i in rackless else path))
        if i in renamed:
            labels["kubernetes.io/hostname"] = f"host-{name}"
        objs.extend(gpu_node(name, labels, total))
    index = index_of(Config(), objs, [in_use(n, u) for n, _, _, u in nodes if u])
    decision = place(index, PlacementRequest("Job ml/x", pods, gpus, Strategy.CONSOLIDATED))
    if decision.outcome is not Outcome.PLACED:
        return
    job = gpu_job("x", pods, gpus, gpu_count=str(gpus), placement_strategy="consolidated")
    emitted = workload.read(subject_of(mutation.mutate(job, BY_KEY["Job"], decision, Config(), "ml/Job/x"))).request
    allowed = {n.name for n in index.nodes.values() if node_matches(n, emitted)}

    def lowest(node):  # its rack, or the node itself where it has none
        return node.labels.get(LEVELS[2]) or node.name

    used = {index.nodes[name] for name in decision.nodes}
    assert set(decision.nodes) <= allowed
    assert allowed <= {n.name for n in index.nodes.values() if lowest(n) in {lowest(u) for u in used}}


@settings(max_examples=100, deadline=None)
@given(clusters(), requests, st.booleans())
def test_distributed_never_overcommits_and_spreads(nodes, shape, latency):
    pods, gpus = shape
    decision = place(build(nodes), PlacementRequest("Job p/x", pods, gpus, Strategy.DISTRIBUTED,
                                                    latency_sensitive=latency))
    free = {name: g - used for name, _, g, used in nodes}
    if decision.outcome is not Outcome.PLACED:
        return
    assert sum(a.pods for a in decision.assignment) == pods
    for a in decision.assignment:
        assert a.pods * gpus <= free[a.node]
    open_nodes = sum(1 for f in free.values() if f >= gpus)
    if pods <= open_nodes and not latency:
        assert all(a.pods == 1 for a in decision.assignment)  # one pod per node where possible


def read_orders(index, gpus: int) -> None:
    """Read every level order for pods of `gpus` GPUs: each catches up on what changed since."""
    for orders in index.tree.orders:
        orders.best_fit(gpus, 1)
        orders.roomiest(gpus, 1)


@settings(max_examples=100, deadline=None)
@given(clusters(), st.lists(st.tuples(st.integers(0, 40), st.integers(0, 8), st.booleans()), max_size=30))
def test_incremental_index_equals_a_rebuild(nodes, events):
    index = build(nodes)
    names = [n[0] for n in nodes]
    live = {}
    for g in (1, 2, 8):
        read_orders(index, g)  # sorted now, so the events below are caught up incrementally
    for i, (which, gpus, bind) in enumerate(events):
        if i % 7 == 3:
            read_orders(index, 2)
        name = names[which % len(names)]
        pod = make_pod(f"ev{which % 5}", name if bind else None, gpus)
        if gpus == 0:
            feed.delete(index, pod, "Pod")
            live.pop(f"ev{which % 5}", None)
        else:
            feed.upsert(index, pod, "Pod")
            live[f"ev{which % 5}"] = pod
    rebuilt = build(nodes)
    for pod in live.values():
        feed.upsert(rebuilt, pod, "Pod")
    assert index.root.pods_now == rebuilt.root.pods_now and index.root.free_hist == rebuilt.root.free_hist
    for level, domains in enumerate(index.levels):
        assert {p: (d.pods_now, d.partly_used) for p, d in domains.items()} == {
            p: (d.pods_now, d.partly_used) for p, d in rebuilt.levels[level].items()}
    assert math.isclose(index.stats().allocation_ratio, rebuilt.stats().allocation_ratio)
    for g in (1, 2, 4, 8):  # best fit and roomiest from the level orders equal a scan of the level
        for level, domains in enumerate(index.levels):
            for pods in (1, 2, 5):
                fitting = [d for d in domains.values() if d.fits_now(g) >= pods]
                scanned = min(fitting, key=lambda d: (d.fits_now(g), d.partly_used, d.free_gpus, d.path), default=None)
                assert index.tree.orders[level].best_fit(g, pods) is scanned
                roomiest = sorted((d for d in domains.values() if d.slots(g)), key=lambda d: (-d.slots(g), d.path))
                assert index.tree.orders[level].roomiest(g, pods) == roomiest[:pods]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters(), requests, st.sampled_from(["zone", "spine", "leaf", "node"]),
       st.sampled_from([Strategy.CONSOLIDATED, Strategy.BALANCED, Strategy.DISTRIBUTED]))
def test_max_domain_is_a_ceiling_the_decision_never_crosses(nodes, shape, ceiling, strategy):
    pods, gpus = shape
    depth = ("zone", "spine", "leaf", "node").index(ceiling)
    decision = place(build(nodes), PlacementRequest("Job p/x", pods, gpus, strategy, max_domain=ceiling))
    groups = oracle_levels(nodes, pods, gpus)
    idle = {}
    for name, path, total, _ in nodes:
        key = (path + (name,))[: depth + 1]
        idle[key] = idle.get(key, 0) + total // gpus
    if max(idle.values()) < pods:  # no domain of that level could ever hold it
        assert decision.outcome is Outcome.NEVER and decision.hold is None
        return
    if not any(c >= pods for c in groups[depth].values()):
        assert decision.outcome is Outcome.WAIT  # waits rather than spilling wider
        assert decision.hold in (Hold.PIN, Hold.GATE)  # a ceiling only a requirement (or the gate) keeps
        return
    assert decision.outcome is Outcome.PLACED and decision.scope.level >= depth
    assert decision.hold is Hold.PIN  # a preference could let the scheduler spill it wider
    paths = {name: path + (name,) for name, path, _, _ in nodes}
    assert len({paths[a.node][: depth + 1] for a in decision.assignment}) == 1


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters(), requests)
def test_a_wait_names_the_node_closest_to_fitting_as_a_scan_of_every_node_would(nodes, shape):
    pods, gpus = shape
    decision = place(build(nodes), PlacementRequest("Job p/x", pods, gpus, Strategy.CONSOLIDATED))
    able = [(name, path, g - used) for name, path, g, used in nodes if g >= gpus * pods]
    if decision.outcome is not Outcome.WAIT or not able:
        return
    # Most pods fitting now, then most free GPUs, then the first by rack and name; the wait may be
    # pinned wider (its pods talk over the NICs anyway), never so as to leave that node out.
    best = min(able, key=lambda n: (-(n[2] // gpus), -n[2], n[1], n[0]))
    assert f"node {best[0]} will fit first" in decision.reasons[0], (decision.reasons[0], best)
    values = [value for _, value in decision.scope.path]
    assert values == [*best[1], best[0]][:len(values)], (decision.scope, best)


# One DRA event: a slice of a node's second pool added (generation 1-2; one half of a pool published in
# 2 slices, or the whole pool in one), or a claim on a node added (the GPU it takes, which claim); or,
# when the last field is False, one of the objects added before deleted
dra_events = st.lists(st.one_of(
    # few nodes and generations, so that events meet on one slice, one pool, one claim
    st.tuples(st.just("slice"), st.integers(0, 2), st.integers(1, 2),
              st.sampled_from([((0,), 2), ((1,), 2), ((0, 1), 1)]), st.booleans()),
    st.tuples(st.just("claim"), st.integers(0, 2), st.integers(0, 7), st.integers(0, 1), st.booleans())),
    max_size=25)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters(), dra_events)
def test_slices_and_claims_applied_one_by_one_count_as_the_final_objects_do(nodes, events):
    """Slices of several generations and halves of pools, claims added and deleted, in any order:
    the index counts what a fresh index of the objects left counts, node by node and per domain."""
    index = build(nodes)
    names = [n[0] for n in nodes]
    objects: dict[tuple, dict] = {}
    for kind, which, a, b, present in events:
        name = names[which % len(names)]
        if kind == "slice":  # halves b[0] of generation a of the node's second pool ("<node>-b") in b[1] slices
            halves, count = b
            obj = make_resource_slice(name, generation=a, slice_count=count,
                                      devices=[f"gpu-{8 + 4 * h + g}" for h in halves for g in range(4)])
            obj["metadata"]["name"] = f"{name}-b-{a}-{'-'.join(map(str, halves))}"
            obj["spec"]["pool"]["name"] = f"{name}-b"
        else:  # claim b of the node takes its GPU a (of its first pool)
            obj = make_allocated_claim(f"{name}-c{b}", name, [f"gpu-{a}"])
        if present:
            objects[(obj["kind"], obj["metadata"]["name"])] = obj
            feed.upsert(index, obj)
        elif objects:  # a deletion takes one of the objects there are
            feed.delete(index, objects.pop(sorted(objects)[which % len(objects)]))
    gpu_objects = [o for name, path, gpus, _ in nodes for o in gpu_node(name, dict(zip(LEVELS, path)), gpus)]
    rebuilt = index_of(Config(), gpu_objects, [
        *(in_use(name, used) for name, _, _, used in nodes if used), *objects.values()])
    assert {n: (s.gpus, s.free, sorted(s.claimed)) for n, s in index.nodes.items()} == {
        n: (s.gpus, s.free, sorted(s.claimed)) for n, s in rebuilt.nodes.items()}
    # a node that once had more GPUs widened the index's aggregates for good: compare what they hold
    assert trimmed(index.root.pods_now) == trimmed(rebuilt.root.pods_now)
    assert trimmed(index.root.free_hist) == trimmed(rebuilt.root.free_hist)
    assert index.inventory_warnings() == rebuilt.inventory_warnings()


def trimmed(counts: list[int]) -> list[int]:
    """Counts per size without the zeros beyond the largest size counted."""
    end = len(counts)
    while end and not counts[end - 1]:
        end -= 1
    return counts[:end]


@st.composite
def nodepools(draw):
    """A Karpenter NodePool: GPUs per node, zones it may launch in, room left under its GPU limit."""
    gpus = draw(st.sampled_from([4, 8, 16]))
    zones = draw(st.lists(st.sampled_from(["z0", "z1", "z9"]), min_size=1, max_size=3, unique=True))
    room_nodes = draw(st.integers(0, 6))
    return {"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "grow"},
            "spec": {"template": {"metadata": {"labels": {"example.com/pool": "grow"}}, "spec": {"requirements": [
                {"key": "karpenter.k8s.aws/instance-gpu-count", "operator": "In", "values": [str(gpus)]},
                {"key": "topology.kubernetes.io/zone", "operator": "In", "values": zones}]}},
                     "limits": {"nvidia.com/gpu": str(room_nodes * gpus)}},
            "status": {"resources": {"nvidia.com/gpu": "0"}}}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters(), requests, nodepools(), st.sampled_from([Strategy.CONSOLIDATED, Strategy.BALANCED]))
def test_a_pool_that_can_grow_takes_what_the_nodes_cannot_and_its_new_nodes_are_allowed(nodes, shape, pool, strategy):
    pods, gpus = shape
    request = PlacementRequest("Job p/x", pods, gpus, strategy)
    without = place(build(nodes), request)
    index = build(nodes)
    feed.upsert(index, pool)
    decision = place(index, request)
    requirements = pool["spec"]["template"]["spec"]["requirements"]
    node_gpus = int(requirements[0]["values"][0])
    room_nodes = int(pool["spec"]["limits"]["nvidia.com/gpu"]) // node_gpus
    takes = gpus <= node_gpus and room_nodes >= math.ceil(pods / (node_gpus // gpus))
    if without.outcome is Outcome.PLACED:  # fits today: placed exactly as without the pool
        assert decision == without
        return
    if not takes:
        assert decision == without
        return
    assert (decision.outcome, decision.code) == (Outcome.WAIT, "GrowsPool")
    pins = {r.key: r.values for r in decision.requirements}
    # A node the pool adds, in the zone pinned, under a leaf and spine no one knew before it launched.
    added = {"karpenter.sh/nodepool": "grow", "example.com/pool": "grow", LEVELS[0]: pins[LEVELS[0]][0],
             LEVELS[1]: "new-spine", LEVELS[2]: "new-leaf"}
    assert pins[LEVELS[0]][0] in requirements[1]["values"]
    assert all(added.get(key) in values for key, values in pins.items())
    assert set(pins) == {"karpenter.sh/nodepool", LEVELS[0]}
