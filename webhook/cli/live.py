"""The live cluster view, composed in one place: the index, and the API adapters over it (the
claims Lease shared with the other replicas, scale-ups, the releaser), each made from the one API
client and handed, with the replicas' records of their recent decisions, to the feed that keeps
the index current (webhook/kube/clusterview.py)."""
from __future__ import annotations

import random
import time
from typing import Callable

from kubernetes import client as k8s_client

from ..kube.clusterview import ApiFeed, Pacing
from ..kube.releaser import Releaser
from ..kube.scaleups import ApiScaleUps
from ..kube.shared_claims import DEFAULT_BUDGET_SECONDS, ApiClaims
from ..kube.shared_decisions import ApiDecisionRecords
from ..settings.config import Config
from ..state.index import ClusterIndex


def live_view(config: Config, api_client: k8s_client.ApiClient, *, claims_namespace: str | None = None,
              claims_budget_seconds: float = DEFAULT_BUDGET_SECONDS, claims_allotment_share: int = 0,
              on_alone: Callable[[], None] = lambda: None, on_scale_up: Callable[[str], None] = lambda _: None,
              on_release: Callable[[str], None] = lambda _: None,
              decision_records: ApiDecisionRecords | None = None, clock: Callable[[], float] = time.monotonic,
              pacing: Pacing = Pacing(), rng: random.Random | None = None) -> ApiFeed:
    """The feed over a new index, not started. `clock` is what holds expire by and readiness is
    measured with; the `on_*` callbacks count what the adapters do (the metrics, in serve);
    `decision_records`, the topology page's records serve shares with the other replicas, are fed too."""
    index = ClusterIndex(config, clock=clock)
    # The watch tells an admission's hold stored, so holds are provisional until it does.
    index.hold_provisionally(config.provisional_hold_seconds)
    if config.provisioning_request_class:
        index.scale_ups = ApiScaleUps(api_client, on_scale_up)
    claims = None
    if claims_namespace:
        claims = ApiClaims(index, api_client, claims_namespace, claims_budget_seconds, on_alone=on_alone,
                           allotment_share=claims_allotment_share)
        index.share_claims(claims)
    releaser = Releaser.over_api(index, api_client, on_release) if config.gate_waits else None
    return ApiFeed(index, api_client, claims=claims, decision_records=decision_records, releaser=releaser, clock=clock,
                   pacing=pacing, rng=rng)
