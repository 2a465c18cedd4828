"""`hack/local-cluster up --bare`, which the benches start (bench/control_plane.py): the control
plane alone, every component running, no node and no webhook registered; `--controller-qps`,
which bench/burst_bench.py raises as large clusters do; and flags that do not go together, refused
in one line before anything starts."""
from __future__ import annotations

import json
import subprocess

import pytest
from e2e.conftest import ROOT, start_cluster, stop_cluster
from kubernetes import client as k8s_client


def test_a_bare_control_plane_runs_with_no_node_and_no_webhook(tmp_path):
    state = tmp_path / "bare"
    bare = start_cluster(state, "--bare", "--controller-qps", "200")
    try:
        assert bare.local_cluster("status").returncode == 0  # every component it started runs
        assert bare.nodes() == []
        registered = k8s_client.AdmissionregistrationV1Api(bare.api).list_mutating_webhook_configuration()
        assert registered.items == []
        assert bare.core.list_namespaced_pod("default").items == []
        manager = json.loads((state / "commands.json").read_text())["kube-controller-manager"]["argv"]
        assert {"--kube-api-qps=200", "--kube-api-burst=300"} <= set(manager)
    finally:
        stop_cluster(state)


@pytest.mark.parametrize("flags, message", [
    (["--bare", "--controller-qps", "-1"], "--controller-qps must be 0"),
    (["--nodes", "0"], "--nodes must be 1 to 10000"),
    (["--nodes", "10001", "--kwok"], "--nodes must be 1 to 10000"),
    (["--shape", "4/4"], "expected SPINES/LEAVES/NODES"),
    (["--replicas", "5"], "--replicas must be 0 to 4"),
    (["--bare", "--kwok"], "--bare starts no nodes"),
    (["--kueue", "--dra"], "--kueue counts nvidia.com/gpu"),
    (["--kueue-strict-fifo"], "--kueue-strict-fifo is a setting of --kueue"),
])
def test_bad_flags_are_refused_before_anything_starts(tmp_path, flags, message):
    state = tmp_path / "refused"
    result = subprocess.run([str(ROOT / "hack" / "local-cluster"), "--state", str(state), "up", *flags],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not state.exists()
