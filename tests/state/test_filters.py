"""state/filters.py on its own: a request's node constraints as kube-scheduler reads them, and the
inverted indexes that answer "does this leave any node out?" without visiting nodes, which must
never be wrong in the direction that matters (a node left out, or a matching node not listed)."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from webhook.settings.config import Config
from webhook.state.filters import NodeFilters, node_matches, tolerates
from webhook.state.members import NodeState
from webhook.core.model import PlacementRequest
from webhook.objects.feed import index_of, parse_node
from webhook.placement.placer import on_nodes
from webhook.kube.demo import make_node

CONFIG = Config()
KEYS = ["pool", "zone", "example.com/gen"]
VALUES = ["a", "b", "7", "12"]


def request(**constraints) -> PlacementRequest:
    return PlacementRequest("Job ml/t", 1, 1, **constraints)


@pytest.mark.parametrize("expression, labels, matches", [
    ({"key": "pool", "operator": "In", "values": ["a", "b"]}, {"pool": "b"}, True),
    ({"key": "pool", "operator": "In", "values": ["a"]}, {}, False),
    ({"key": "pool", "operator": "NotIn", "values": ["a"]}, {}, True),  # absent is not in
    ({"key": "pool", "operator": "Exists"}, {"pool": ""}, True),
    ({"key": "pool", "operator": "DoesNotExist"}, {"pool": "a"}, False),
    ({"key": "gen", "operator": "Gt", "values": ["9"]}, {"gen": "12"}, True),  # numbers, not text
    ({"key": "gen", "operator": "Lt", "values": ["9"]}, {"gen": "x"}, False),  # not a number: no match
], ids=["in", "in-absent", "notin-absent", "exists-empty", "doesnotexist", "gt-numeric", "lt-not-a-number"])
def test_an_expression_matches_as_kube_scheduler_reads_it(expression, labels, matches):
    node = NodeState(parse_node(make_node("n", labels), CONFIG))
    assert node_matches(node, request(required_node_terms=({"matchExpressions": [expression]},))) is matches


@pytest.mark.parametrize("toleration, tolerated", [
    ({"operator": "Exists"}, True),  # no key: tolerates every taint
    ({"key": "gpu", "operator": "Exists", "effect": "NoExecute"}, False),  # another effect
    ({"key": "gpu", "value": "shared", "effect": "NoSchedule"}, True),  # Equal is the default operator
    ({"key": "gpu", "value": "other"}, False),
])
def test_tolerations(toleration, tolerated):
    assert tolerates([toleration], ("gpu", "shared", "NoSchedule")) is tolerated


expression = st.builds(lambda key, op, values: {"key": key, "operator": op,
                                                **({"values": values} if op in ("In", "NotIn", "Gt", "Lt") else {})},
                       st.sampled_from(KEYS), st.sampled_from(["In", "NotIn", "Exists", "DoesNotExist", "Gt"]),
                       st.lists(st.sampled_from(VALUES), min_size=1, max_size=2, unique=True))
node_strategy = st.builds(lambda labels, tainted, gpus: (labels, tainted, gpus),
                          st.dictionaries(st.sampled_from(KEYS), st.sampled_from(VALUES), max_size=3),
                          st.booleans(), st.sampled_from([0, 8]))
names = st.lists(st.sampled_from([f"n{i}" for i in range(9)]), max_size=3)  # n8: a node that is not there
request_strategy = st.builds(
    lambda selector, terms, tolerate: request(
        node_selector=selector, required_node_terms=tuple(
            {"matchExpressions": t, **({"matchFields": [{"key": "metadata.name", "operator": "In", "values": n}]}
                                       if n else {})} for t, n in terms),
        tolerations=({"key": "dedicated", "operator": "Exists"},) if tolerate else ()),
    st.dictionaries(st.sampled_from(KEYS), st.sampled_from(VALUES), max_size=1),
    st.lists(st.tuples(st.lists(expression, max_size=2), names), max_size=2), st.booleans())


@settings(max_examples=300, deadline=None)
@given(st.lists(node_strategy, min_size=1, max_size=8), request_strategy)
def test_the_indexes_never_leave_out_a_node_a_request_may_use(specs, wanted):
    nodes = {}
    filters = NodeFilters()
    for i, (labels, tainted, gpus) in enumerate(specs):
        taints = [{"key": "dedicated", "value": "x", "effect": "NoSchedule"}] if tainted else None
        state = NodeState(parse_node(make_node(f"n{i}", labels, gpus, taints=taints), CONFIG))
        nodes[state.name] = state
        filters.count(state, +1)
    gpu_nodes = {name: n for name, n in nodes.items() if n.gpus > 0}
    matching = {name for name, n in gpu_nodes.items() if node_matches(n, wanted)}
    if filters.filters_nothing(wanted, gpu_nodes):
        assert matching == set(gpu_nodes)  # "nothing filtered" is only said when it is true
    assert matching <= {n.name for n in filters.candidates(wanted, gpu_nodes)}
    for state in nodes.values():  # counting out restores the empty index
        filters.count(state, -1)
    assert filters.gpu_nodes == 0 and not filters.by_label and not any(filters.taint_counts.values())


def test_subsets_naming_nodes_are_kept_four_at_a_time_beside_the_others():
    """An allotment's nodes for spreads change as they fill: every subset is counted again at each
    change of its nodes, so old ones must not pile up to MAX_SUBSETS."""
    index = index_of(CONFIG, [make_node(f"n{i}", {"pool": "a" if i % 2 else "b"}, 8) for i in range(12)], [])
    selected = request(node_selector={"pool": "a"})
    index.restricted_to(selected)
    for i in range(6):
        subset = index.restricted_to(on_nodes(request(), [f"n{i}", f"n{i + 1}"]))
        assert set(subset.nodes) == {f"n{i}", f"n{i + 1}"}
    kept = [held for held, _ in index.subsets]
    assert len(kept) == 5 and selected in kept
    assert [term["matchFields"][0]["values"] for held in kept if held is not selected
            for term in held.required_node_terms] == [[f"n{i}", f"n{i + 1}"] for i in range(2, 6)]


def test_a_subset_naming_other_nodes_is_the_oldest_alike_moved_and_counts_as_one_built_afresh():
    """Nodes for spreads change by a few at each of an allotment's writes: the subset for the new
    names is the least recently used one naming nodes for an otherwise equal request, with only
    the nodes that differ moved, and it counts GPUs as a subset built for those names would."""
    nodes = [make_node(f"n{i}", {"pool": "a" if i % 2 else "b", "topology.scheduler/leaf": f"l{i % 3}"}, 8)
             for i in range(12)]
    index, fresh = index_of(CONFIG, nodes, []), index_of(CONFIG, nodes, [])
    index.reserve("ml/Job/held", {"n3": [(0, 1, 2)], "n7": [(4,)]})
    fresh.reserve("ml/Job/held", {"n3": [(0, 1, 2)], "n7": [(4,)]})
    olds = [index.restricted_to(on_nodes(request(), [f"n{i}", f"n{i + 1}", f"n{i + 2}"])) for i in range(4)]
    unlike = index.restricted_to(on_nodes(request(node_selector={"pool": "a"}), ["n9", "n11"]))
    assert len({id(subset) for subset in [*olds, unlike]}) == 5
    moved = index.restricted_to(on_nodes(request(), ["n1", "n3", "n7"]))
    assert moved is olds[1], "the oldest alike kept (olds[0] went when the fifth subset naming nodes was built)"
    built = fresh.restricted_to(on_nodes(request(), ["n1", "n3", "n7"]))
    assert set(moved.nodes) == set(built.nodes) == {"n1", "n3", "n7"}
    assert moved.root.free_gpus == built.root.free_gpus == 8 + 5 + 7
    assert {leaf.path: leaf.free_gpus for leaf in moved.levels[-1].values()} == \
        {leaf.path: leaf.free_gpus for leaf in built.levels[-1].values()}
    assert index.restricted_to(on_nodes(request(node_selector={"pool": "a"}), ["n9", "n11"])) is unlike
