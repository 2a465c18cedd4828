"""The topology page across replicas, on the real apiserver with two webhook replicas sharing their
records of recent decisions (webhook/kube/shared_decisions.py): whichever replica a reader reaches,
it lists the same decisions, each naming the replica that made it."""
from __future__ import annotations

import time

from conftest import eventually
from e2e.conftest import job
from e2e.test_holds import _https, ports
from webhook.admission import make_review

CONSOLIDATED = {"topology.scheduler/placement-strategy": "consolidated"}


def test_two_replicas_serve_the_same_decision_list_each_decision_naming_its_replica(cluster):
    with cluster.namespace("page") as ns:
        cluster.apply(job("through-the-service", 1, gpus=1, annotations=CONSOLIDATED), namespace=ns)
        binds = ports(cluster, "--bind")
        for i, port in enumerate(binds):  # one decision made on each replica, whatever the relay does
            review = make_review(job(f"straight-to-{i}", 1, gpus=1, annotations=CONSOLIDATED), namespace=ns,
                                 dry_run=True, uid=f"page-{i}-{time.monotonic_ns()}")
            assert _https(cluster, port, "/mutate", review)["response"]["allowed"]

        def lists() -> list[list[tuple[str, str, str]]] | None:
            pages = [_https(cluster, port, f"/topology.json?namespace={ns}")
                     for port in ports(cluster, "--metrics-bind")]
            found = [sorted((w["name"], w["replica"], w["outcome"]) for w in page["workloads"]) for page in pages]
            return found if len(found[0]) == 1 + len(binds) and all(seen == found[0] for seen in found) else None

        pages = eventually(lists, timeout=30, what="every replica's page listing every replica's decisions")
        assert len(pages) == len(binds) == 2
        replicas = {name: replica for name, replica, _ in pages[0]}
        assert replicas["straight-to-0"] == "webhook-0" and replicas["straight-to-1"] == "webhook-1"
        assert replicas["through-the-service"] in ("webhook-0", "webhook-1")
