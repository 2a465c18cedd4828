"""bestfit.LevelOrders on its own: after any sequence of changes, an order read (it catches up on
the changes since it was last read) answers what a full sort of the level's domains by its
ordering would."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from webhook.core import orderings
from webhook.state.bestfit import LevelOrders


class FakeDomain:
    """A domain as the orders read it: room per pod size, partly used nodes, free GPUs, path."""

    def __init__(self, path: tuple, width: int = 8) -> None:
        self.path = path
        self.free_by_node: list[int] = []
        self.width = width
        self.touched = -1

    def fits_now(self, gpus: int) -> int:
        return sum(free // gpus for free in self.free_by_node)

    def slots(self, gpus: int) -> int:
        return sum(1 for free in self.free_by_node if free >= gpus)

    @property
    def free_gpus(self) -> int:
        return sum(self.free_by_node)

    @property
    def partly_used(self) -> int:
        return sum(1 for free in self.free_by_node if 0 < free < self.width)


change = st.tuples(st.integers(0, 7), st.integers(0, 3), st.integers(0, 8))  # (domain, node, free GPUs)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(change, max_size=6), min_size=1, max_size=6), st.sampled_from([1, 2, 4, 8]))
def test_an_order_caught_up_after_any_changes_answers_as_a_full_sort_would(rounds, gpus):
    domains = {(("leaf", f"l{i}"),): FakeDomain((("leaf", f"l{i}"),)) for i in range(8)}
    for domain in domains.values():
        domain.free_by_node = [8, 8, 8, 8]
    level = LevelOrders(lambda: domains)
    by_index = list(domains.values())
    for changes in rounds:
        for which, node, free in changes:
            by_index[which].free_by_node[node] = free
            level.touch(by_index[which])
        for pods in range(1, 34):  # every answer: a key kept out of order misleads some search
            fitting = [d for d in domains.values() if d.fits_now(gpus) >= pods]
            want = min(fitting, key=lambda d: orderings.best_fit(d, gpus)) if fitting else None
            assert level.best_fit(gpus, pods) is want
        open_ones = sorted((d for d in domains.values() if d.slots(gpus)), key=lambda d: orderings.roomiest(d, gpus))
        assert level.roomiest(gpus, 3) == open_ones[:3]


def test_a_domain_pruned_since_it_was_touched_is_never_answered():
    domains = {(("leaf", "a"),): FakeDomain((("leaf", "a"),)), (("leaf", "b"),): FakeDomain((("leaf", "b"),))}
    for domain in domains.values():
        domain.free_by_node = [8]
    level = LevelOrders(lambda: domains)
    level.best_fit(8, 1)  # sorted now: the read below catches up on the change
    gone = domains.pop((("leaf", "a"),))
    level.touch(gone)
    assert level.best_fit(8, 1) is domains[(("leaf", "b"),)]


names = st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=4)
paths = st.lists(st.tuples(st.sampled_from(["leaf", "leaf-b", "kubernetes.io/hostname", ""]), names),
                 min_size=1, max_size=3)


@settings(max_examples=200, deadline=None)
@given(st.lists(paths, min_size=1, max_size=12, unique_by=tuple).map(lambda ps: [tuple(p) for p in ps]))
def test_domains_alike_but_for_their_paths_come_in_the_order_of_their_paths(drawn):
    """Ties go by path, whatever the paths: a value a prefix of another, an unnamed domain's empty
    value, labels of either level and of lone nodes, paths of any length."""
    domains = {path: FakeDomain(path) for path in drawn}
    for domain in domains.values():
        domain.free_by_node = [8]
    level = LevelOrders(lambda: domains)
    assert [d.path for d in level.roomiest(8, len(domains))] == sorted(domains)
    assert level.best_fit(8, 1).path == min(domains)


def test_an_index_ranks_by_the_orderings_it_is_built_with_in_its_tree_its_subsets_and_after_a_relevel():
    import dataclasses

    from webhook.core.model import PlacementRequest
    from webhook.kube.demo import demo_cluster
    from webhook.objects.feed import index_of
    from webhook.settings.config import Config

    mine = dataclasses.replace(orderings.DEFAULT, best_fit=lambda domain, gpus: (domain.fits_now(gpus), 0, 0, domain.path))
    index = index_of(Config(), *demo_cluster(), orderings=mine)
    assert index.preset is not None  # `levels: auto` rebuilt the tree on the preset the nodes' labels call for
    subset = index.restricted_to(PlacementRequest("Job a/b", 1, 8, node_selector={"topology.scheduler/leaf": "leaf-1"}))
    assert subset is not index.tree
    assert index.tree.orderings is subset.orderings is mine
