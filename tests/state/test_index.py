"""The index against facts alone (no API dict: reading those is tests/objects/test_feed.py's):
what `apply` counts propagates to every domain above the node, a fact of a node not seen yet is
kept until it arrives, and any sequence of changes leaves the index as a rebuild from what is
left would make it."""
from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from webhook.core.model import PlacementRequest, Strategy
from webhook.settings.config import Config
from webhook.state.devices import DraFact
from webhook.state.dra import GPU_DRIVER, ClaimRefs, SliceFacts
from webhook.state.index import ClusterIndex, NodeGone
from webhook.state.pods import PodFacts, PodGone
from webhook.state.members import NodeInfo

ZONE, LEAF = "topology.kubernetes.io/zone", "topology.scheduler/leaf"
CONFIG = Config(levels_auto=False)  # levels as configured: `levels: auto` keeps the preset it chose (test_config.py)
# A request whose pods take CPU too: its constrained subset counts free GPUs by what else fits.
CPU_BOUND = PlacementRequest("Job ml/cpu", 1, 1, Strategy.BALANCED, resources=(("cpu", 8000), ("pods", 1)))


def node(name: str, leaf: str, gpus: int = 8, out: str = "") -> NodeInfo:
    """A Node's facts as the feed reads them: allocatable GPUs from the device plugin."""
    return NodeInfo(name=name, labels={ZONE: "z1", LEAF: leaf}, out=out, taints=(), gpus=gpus,
                    nvlink_domains=(tuple(range(gpus)),) if gpus else (), profile=CONFIG.profile_for(""),
                    bandwidth_gbps=None, other_allocatable={"cpu": 64000, "pods": 110}, plugin_gpus=gpus)


def pod(name: str, on: str | None, gpus: int, *, finished: bool = False, terminating: bool = False, cpu: int = 0,
        reservation: str | None = None, waiting: str | None = None) -> PodFacts:
    return PodFacts(key=f"ml/{name}", namespace="ml", node_name=on, finished=finished, terminating=terminating,
                    gpus=gpus, covered_by_claim=False, requests=(("cpu", cpu),) if cpu else (),
                    reservation=reservation, admission=None, gpu_ids=None, waiting_for=((LEAF, waiting),) if waiting else None,
                    held=None, gate=None, claims=ClaimRefs(), obj={})


def two_leaves() -> ClusterIndex:
    index = ClusterIndex(CONFIG, clock=lambda: 0.0)
    for name, leaf in (("a1", "a"), ("a2", "a"), ("b1", "b")):
        index.apply(node(name, leaf))
    return index


def leaf(index: ClusterIndex, name: str):
    return next(d for d in index.levels[-1].values() if d.ref.name == name)


def test_a_bound_pod_s_gpus_leave_its_node_and_every_domain_above_it():
    index = two_leaves()
    index.apply(pod("p", "a1", 6))
    assert index.nodes["a1"].free == 2
    assert (leaf(index, "a").free_gpus, leaf(index, "b").free_gpus, index.root.free_gpus) == (10, 8, 18)
    assert leaf(index, "a").fits_now(8) == 1 and leaf(index, "a").fits_idle(8) == 2  # whole nodes, not summed GPUs
    index.apply(pod("p", "a1", 6, finished=True))
    assert index.root.free_gpus == 24 and index.nodes["a1"].pods == {}


def test_a_pod_being_deleted_still_holds_its_gpus_and_counts_as_freeing_soon():
    index = two_leaves()
    index.apply(pod("p", "b1", 8, terminating=True))
    assert index.nodes["b1"].free == 0 and leaf(index, "b").freeing == 8
    index.apply(PodGone("ml/p", "ml", ""))
    assert index.nodes["b1"].free == 8 and leaf(index, "b").freeing == 0


def test_a_pod_bound_to_a_node_not_seen_yet_counts_once_the_node_arrives_and_after_it_leaves_and_returns():
    index = two_leaves()
    index.apply(pod("early", "c1", 4))
    assert index.root.free_gpus == 24
    index.apply(node("c1", "b"))
    assert index.nodes["c1"].free == 4 and leaf(index, "b").free_gpus == 12
    index.apply(NodeGone("c1"))
    index.apply(node("c1", "b"))
    assert index.nodes["c1"].free == 4, "its pods are kept while the node is away"


def test_deleting_a_pod_placed_on_its_own_ends_its_hold_but_a_job_s_pod_does_not():
    index = two_leaves()
    index.reserve("ml/Pod/solo", {"b1": [(0, 1)]})
    index.reserve("ml/Job/train", {"a2": [(0, 1, 2, 3)]})
    assert (index.nodes["b1"].free, index.nodes["a2"].free) == (6, 4)
    index.apply(PodGone("ml/solo-uid", "ml", "ml/Pod/solo"))
    index.apply(PodGone("ml/train-0-uid", "ml", "ml/Job/train"))
    assert (index.nodes["b1"].free, index.nodes["a2"].free) == (8, 4)


def test_a_pending_pod_waiting_in_a_domain_is_a_waiter_until_it_is_bound():
    index = two_leaves()
    index.apply(pod("w", None, 8, reservation="ml/Job/w", waiting="a"))
    assert index.pods.waiters.get("ml/w").path == ((LEAF, "a"),)
    index.apply(pod("w", "a1", 8, reservation="ml/Job/w"))
    assert index.pods.waiters.get("ml/w") is None and index.pods.running() == {"ml/Job/w": 1}


def test_gpus_from_a_resource_slice_count_for_a_node_without_allocatable_gpus_until_the_slice_goes():
    index = two_leaves()
    index.apply(node("d1", "b", gpus=0))
    slice_ = SliceFacts((GPU_DRIVER, "d1"), 1, 1, (("d1", tuple(f"gpu-{i}" for i in range(4))),))
    index.apply(DraFact("ResourceSlice", "d1-slice", slice_))
    assert index.nodes["d1"].gpus == 4 and leaf(index, "b").free_gpus == 12
    index.apply(DraFact("ResourceSlice", "d1-slice", None))
    assert index.nodes["d1"].gpus == 0 and leaf(index, "b").free_gpus == 8


# ----- any sequence of changes equals a rebuild from what is left ----------------------------------

NODES = ("a1", "a2", "b1", "c1")
change = st.one_of(
    st.tuples(st.just("node"), st.sampled_from(NODES), st.sampled_from(["a", "b", "c"]), st.sampled_from([0, 4, 8]),
              st.sampled_from(["", "", "cordoned"])),
    st.tuples(st.just("node gone"), st.sampled_from(NODES)),
    st.tuples(st.just("pod"), st.integers(0, 7), st.one_of(st.none(), st.sampled_from(NODES)),
              st.sampled_from([0, 1, 2, 4]), st.booleans(), st.booleans(), st.sampled_from([0, 0, 9000]),
              st.sampled_from([None, "ml/Job/j0", "ml/Job/j1"]), st.sampled_from([None, "a", "b"])),
    st.tuples(st.just("pod gone"), st.integers(0, 7)),
)


def fact(change: tuple):
    what, *args = change
    if what == "node":
        name, leaf_name, gpus, out = args
        return node(name, leaf_name, gpus, out)
    if what == "node gone":
        return NodeGone(args[0])
    if what == "pod":
        i, on, gpus, finished, terminating, cpu, reservation, waiting = args
        return pod(f"p{i}", on, gpus, finished=finished, terminating=terminating, cpu=cpu, reservation=reservation,
                   waiting=waiting)
    return PodGone(f"ml/p{args[0]}", "ml", "")


def counted(index: ClusterIndex) -> tuple:
    """What the index counts, GPU ids aside (a pod's ids depend on the order pods were bound in)."""
    def domains(tree) -> dict:
        return {d.ref.path: (d.free_gpus, d.alloc_gpus, d.nodes, d.partly_used, list(d.pods_now), list(d.pods_idle),
                             list(d.free_hist), d.freeing)
                for d in [tree.root, *(d for level in tree.levels for d in level.values())]}
    nodes = {n.name: (n.free, n.gpus, {key: gpus for key, (gpus, _) in n.pods.items()}, set(n.terminating),
                      {k: v for k, v in n.requested.items() if v}, n.out) for n in index.nodes.values()}
    subset = index.restricted_to(CPU_BOUND)
    orphans = {name: {key: gpus for key, (gpus, _) in pods.items()} for name, pods in index.pods.orphans.items()}
    return (domains(index.tree), nodes, domains(subset), index.pods.on_node, index.pods.holders, orphans,
            {key: (w.key, w.path, w.gpus) for key, w in index.pods.waiters.pods.items()}, index.keys("Pod"),
            index.stats())


@settings(max_examples=300, deadline=None)
@given(st.lists(change, max_size=50))
# Found by this test: a counted pod's later word that it is not terminating, or that it carries a reservation
@example([("node", "b1", "a", 0, ""), ("pod", 1, "b1", 1, False, True, 0, None, None),
          ("pod", 1, "b1", 1, False, False, 0, None, None)])
@example([("node", "b1", "a", 0, ""), ("pod", 1, "b1", 1, False, False, 0, None, None),
          ("pod", 1, "b1", 1, False, False, 0, "ml/Job/j0", None)])
def test_any_sequence_of_changes_leaves_the_index_as_a_rebuild_from_what_is_left(changes):
    incremental = ClusterIndex(CONFIG, clock=lambda: 0.0)
    incremental.restricted_to(CPU_BOUND)  # a constrained subset that each change must keep counted
    left: dict[tuple[str, str], tuple] = {}  # the last word on each node and pod still there
    for change_ in changes:
        incremental.apply(fact(change_))
        what, name = change_[0].split()[0], change_[1]
        left.pop((what, name), None)  # a later word comes after the earlier ones
        if not change_[0].endswith("gone"):
            left[(what, name)] = change_
    rebuilt = ClusterIndex(CONFIG, clock=lambda: 0.0)
    rebuilt.restricted_to(CPU_BOUND)
    for change_ in sorted(left.values(), key=lambda c: c[0] != "node"):  # nodes first, as a relist of each kind
        rebuilt.apply(fact(change_))
    assert counted(incremental) == counted(rebuilt)
