"""The strategies' registry (core/strategies.py): every strategy registered once, and what a
decision does read from its rules, not from its name."""
from __future__ import annotations

import pytest

from webhook.core.model import Hold, Outcome, PlacementRequest
from webhook.core.strategies import DEFAULT, REGISTRY, Layout, Strategy
from webhook.kube.demo import demo_cluster
from webhook.objects import user_annotations
from webhook.objects.feed import index_of
from webhook.placement.placer import place
from webhook.settings.config import Config


def test_every_strategy_is_registered_under_its_own_name_with_its_line():
    assert list(REGISTRY) == list(Strategy) and DEFAULT in REGISTRY
    assert all(rules.name is name and rules.doc for name, rules in REGISTRY.items())


def test_the_annotation_takes_exactly_the_registered_names_and_lists_them_when_refused():
    assert [user_annotations.strategy("Job a/b", f" {name.value.upper()} ") for name in REGISTRY] == list(REGISTRY)
    assert user_annotations.strategy("Job a/b", None) is DEFAULT
    with pytest.raises(user_annotations.InvalidAnnotation) as err:
        user_annotations.strategy("Job a/b", "tight")
    assert err.value.args[0].endswith("allowed: " + ", ".join(name.value for name in REGISTRY))


@pytest.mark.parametrize("strategy", list(REGISTRY), ids=lambda strategy: strategy.value)
def test_a_placed_decision_is_laid_out_and_held_as_its_strategy_is_registered(strategy):
    nodes, pods = demo_cluster()
    decision = place(index_of(Config(), nodes, pods), PlacementRequest("Job ml/train", 4, 8, strategy))
    rules = strategy.rules
    assert decision.outcome is Outcome.PLACED
    assert decision.hold is (Hold.PIN if rules.pinned else Hold.PREFER)
    assert bool(decision.spread_keys) is (rules.layout is Layout.SPREAD)  # spread constraints only for a spread
