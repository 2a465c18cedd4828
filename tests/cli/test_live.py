"""serve's live view composed in cli/live.py: every adapter over the one index the feed fills."""
from __future__ import annotations

import pytest
from kubernetes.client import ApiClient, Configuration

from conftest import LABELS, eventually
from webhook.cli.live import live_view
from webhook.kube.demo import make_node
from webhook.kube.scaleups import ApiScaleUps
from webhook.settings.config import Config

UNREACHABLE = ApiClient(Configuration(host="http://127.0.0.1:9"))  # building the view calls nothing


def test_the_releaser_the_claims_and_the_scale_ups_work_on_the_index_the_feed_fills():
    config = Config(gate_waits=True, provisioning_request_class="check-capacity.autoscaling.x-k8s.io")
    feed = live_view(config, UNREACHABLE, claims_namespace="topology-system")
    assert feed.releaser is not None and feed.releaser.index is feed.index
    assert feed.claims is not None and feed.claims.index is feed.index and feed.index.shared_claims is feed.claims
    assert isinstance(feed.index.scale_ups, ApiScaleUps)
    assert feed.index.ledger.provisional_seconds == config.provisional_hold_seconds  # the watch confirms holds


@pytest.mark.parametrize("config, claims_namespace", [
    pytest.param(Config(gate_waits=False), None, id="no gated waits, no shared claims, no scale-up class"),
    pytest.param(Config(gate_waits=False), "", id="an empty claims namespace shares nothing"),
])
def test_an_adapter_the_settings_do_not_ask_for_is_not_made(config, claims_namespace):
    feed = live_view(config, UNREACHABLE, claims_namespace=claims_namespace)
    assert (feed.releaser, feed.claims, feed.index.shared_claims, feed.index.scale_ups) == (None, None, None, None)


def test_a_node_the_feed_lists_is_in_the_index_the_releaser_passes_over(fake, make_view):
    fake.put_node(make_node("gpu-1", LABELS, gpus=8))
    view = make_view(fake, Config(gate_waits=True))
    view.start()
    assert view.wait_synced(15)
    assert view.releaser is not None
    assert eventually(lambda: "gpu-1" in view.releaser.index.nodes, what="the node in the releaser's index")
