"""state/tree.py on its own: where a node sits in the tree, and the per-domain aggregates kept
incrementally as nodes come and go and their free GPUs move, checked against a recount."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from webhook.settings.config import Config
from webhook.settings.loading import levels_from
from webhook.settings.presets import HOSTNAME_LABEL
from webhook.core.model import Interconnect
from webhook.objects.feed import parse_node
from webhook.state.members import NodeState
from webhook.state.tree import Domain, TopologyTree
from webhook.kube.demo import make_node

CONFIG = Config(levels=levels_from(["example.com/spine", "example.com/leaf"]), levels_auto=False)
SPINE, LEAF = "example.com/spine", "example.com/leaf"


def node(name: str, labels: dict, gpus: int = 8):
    return NodeState(parse_node(make_node(name, labels, gpus), CONFIG))


def test_a_missing_label_above_one_the_node_carries_is_a_shared_unnamed_domain_and_below_it_the_node_is_alone():
    tree = TopologyTree(CONFIG)
    leafy = [node(f"n{i}", {LEAF: "rack-1"}) for i in range(2)]
    bare = node("bare", {})
    for member in [*leafy, bare]:
        tree.attach(member)
    assert leafy[0].domain is leafy[1].domain  # one rack, under the spine nobody labelled
    assert leafy[0].domain.path == ((SPINE, ""), (LEAF, "rack-1"))
    assert bare.domain.path == ((HOSTNAME_LABEL, "bare"), (HOSTNAME_LABEL, "bare"))  # shares nothing


def recount(domain: Domain) -> tuple:
    nodes = list(_nodes(domain)) if domain.children else []
    width = len(domain.pods_now) - 1
    return (sum(n.free for n in nodes), sum(n.gpus for n in nodes if n.eligible), len(nodes),
            sum(1 for n in nodes if 0 < n.free < (n.gpus if n.eligible else 0)),
            [0] + [sum(n.free // g for n in nodes) for g in range(1, width + 1)],
            [0] + [sum(n.gpus // g for n in nodes) for g in range(1, width + 1)])


def aggregates(domain: Domain) -> tuple:
    return domain.free_gpus, domain.alloc_gpus, domain.nodes, domain.partly_used, domain.pods_now, domain.pods_idle


def _nodes(member):
    if not member.children:
        yield member
        return
    for child in member.children.values():
        yield from _nodes(child)


event = st.one_of(
    st.tuples(st.just("attach"), st.integers(0, 9), st.sampled_from(["s1", "s2", None]),
              st.sampled_from(["l1", "l2", "l3", None]), st.sampled_from([0, 4, 8, 16])),
    st.tuples(st.just("detach"), st.integers(0, 9)),
    st.tuples(st.just("shift"), st.integers(0, 9), st.integers(0, 16)),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(event, max_size=40))
def test_aggregates_kept_by_events_equal_a_recount_of_the_nodes_below(events):
    tree = TopologyTree(CONFIG)
    for kind, index, *rest in events:
        name = f"n{index}"
        present = tree.nodes.get(name)
        if kind == "attach" and present is None:
            spine, leaf, gpus = rest
            labels = {k: v for k, v in ((SPINE, spine), (LEAF, leaf)) if v}
            fresh = node(name, labels, gpus)
            if gpus > tree.width:
                tree.grow(gpus)
            tree.attach(fresh)
        elif kind == "detach" and present is not None:
            tree.detach(present)
        elif kind == "shift" and present is not None:
            after = min(rest[0], present.gpus)
            tree.shift_free(present, present.free, after)
    assert aggregates(tree.root) == recount(tree.root)
    for domain in (d for level in tree.levels for d in level.values()):
        assert domain.children, f"{domain} is empty and should have been pruned"
        assert aggregates(domain) == recount(domain), domain


def test_a_pods_link_is_nvlink_only_inside_one_nvlink_domain():
    pcie_pairs = NodeState(parse_node(make_node("pairs", {}, 4, annotations={"topology.scheduler/nvlink-domains": "0-1,2-3"}),
                                      CONFIG))
    assert pcie_pairs.link_for((0, 1)) is Interconnect.NVLINK
    assert pcie_pairs.link_for((1, 2)) is Interconnect.PCIE
    assert pcie_pairs.link_for((3,)) is Interconnect.NVLINK  # one GPU talks to nobody


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(["0-7", "0-3,4-7", "0-1,2-3,4-5,6-7", "0-5", "0-7,8-9", None]),
       st.sets(st.integers(0, 7)), st.integers(1, 8))
def test_a_pod_is_aligned_where_the_gpus_picked_for_it_share_an_nvlink_domain(declared, taken, gpus):
    """pod_aligned skips the pick where one domain holds every GPU; it must answer as the pick does,
    wherever the node's domains leave GPUs out (0-5) or name more than it has (0-7,8-9)."""
    annotations = {"topology.scheduler/nvlink-domains": declared} if declared else {}
    state = NodeState(parse_node(make_node("n", {}, 8, annotations=annotations), CONFIG))
    state.pods["p"] = (len(taken), tuple(sorted(taken)))
    picked = state.pick_gpus(gpus, state.taken_ids)
    assert state.pod_aligned(gpus) is (state.link_for(picked) is Interconnect.NVLINK)
