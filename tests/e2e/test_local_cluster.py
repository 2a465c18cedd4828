"""`hack/local-cluster up --bare`, which the benches start (bench/control_plane.py): the control
plane alone, every component running, no node and no webhook registered."""
from __future__ import annotations

from kubernetes import client as k8s_client

from e2e.conftest import start_cluster, stop_cluster


def test_a_bare_control_plane_runs_with_no_node_and_no_webhook(tmp_path):
    state = tmp_path / "bare"
    bare = start_cluster(state, "--bare")
    try:
        assert bare.local_cluster("status").returncode == 0  # every component it started runs
        assert bare.nodes() == []
        registered = k8s_client.AdmissionregistrationV1Api(bare.api).list_mutating_webhook_configuration()
        assert registered.items == []
        assert bare.core.list_namespaced_pod("default").items == []
    finally:
        stop_cluster(state)
