"""`mutate` refuses input larger than it may be, before reading it, in one line with exit 2 (the
documented "bad input" status): files over their size, objects the apiserver would refuse for
their size or their devices, and YAML whose aliases expand without end. What passes is read in
time linear in its size."""
from __future__ import annotations

import io
import json

import pytest
import yaml

from tests.fixtures.builders import gpu_job
from webhook.cli import CLUSTER_FILE_MAX_BYTES, MANIFEST_FILE_MAX_BYTES, OBJECT_MAX_BYTES, main
from webhook.kube import demo
from webhook.objects.feed import index_of
from webhook.settings.config import Config
from webhook.settings.presets import PRESETS
from webhook.state import growth

FIXTURES = "tests/fixtures"


def mutate(capsys, *argv: str) -> tuple[int, str]:
    code = main(["mutate", *argv])
    return code, capsys.readouterr().err


def files(tmp_path, nodes: list[dict] | None = None, job: dict | None = None) -> tuple[str, str]:
    """A nodes file (one node of 8 GPUs unless given) and a job file (one pod of 8 GPUs unless given)."""
    (tmp_path / "nodes.yaml").write_text(yaml.safe_dump_all(nodes or [demo.make_node("n1", {})]))
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job or gpu_job("train", 1, 8)))
    return str(tmp_path / "nodes.yaml"), str(tmp_path / "job.yaml")


def sparse(path, size: int) -> str:
    """A file of `size` bytes that takes no room (and that nothing should read)."""
    with open(path, "wb") as handle:
        handle.truncate(size)
    return str(path)


# ----- file sizes ---------------------------------------------------------------------------------

@pytest.mark.parametrize("flag", ["--nodes", "--pods"])
def test_a_cluster_file_over_64_mib_is_refused_unread_in_one_line(tmp_path, capsys, flag):
    nodes, job = files(tmp_path)
    big = sparse(tmp_path / "big.yaml", CLUSTER_FILE_MAX_BYTES + 1)
    argv = ["--nodes", big] if flag == "--nodes" else ["--nodes", nodes, "--pods", big]
    code, err = mutate(capsys, *argv, "-f", job)
    assert code == 2
    assert err.splitlines() == [f"topology-webhook: error: {big}: {CLUSTER_FILE_MAX_BYTES + 1} bytes is too big; "
                                f"allowed: at most {CLUSTER_FILE_MAX_BYTES} bytes (64 MiB) per file"]


def test_a_manifest_file_over_16_mib_is_refused_unread_and_so_is_stdin(tmp_path, capsys, monkeypatch):
    nodes, _ = files(tmp_path)
    big = sparse(tmp_path / "big.yaml", MANIFEST_FILE_MAX_BYTES + 1)
    code, err = mutate(capsys, "--nodes", nodes, "-f", big)
    assert code == 2
    assert err.splitlines() == [f"topology-webhook: error: {big}: {MANIFEST_FILE_MAX_BYTES + 1} bytes is too big; "
                                f"allowed: at most {MANIFEST_FILE_MAX_BYTES} bytes (16 MiB) per file"]
    monkeypatch.setattr("sys.stdin", io.StringIO("#" * (MANIFEST_FILE_MAX_BYTES + 1)))
    code, err = mutate(capsys, "--nodes", nodes, "-f", "-")
    assert code == 2
    assert err.splitlines() == [f"topology-webhook: error: stdin: more than {MANIFEST_FILE_MAX_BYTES} bytes is too "
                                f"big; allowed: at most {MANIFEST_FILE_MAX_BYTES} bytes (16 MiB) per file"]


# ----- objects the apiserver would refuse ---------------------------------------------------------

def test_an_object_over_the_apiservers_3_mib_is_refused_naming_it_and_its_file(tmp_path, capsys):
    status = {"apiVersion": "v1", "kind": "ConfigMap",
              "metadata": {"name": "cluster-autoscaler-status", "namespace": "kube-system"},
              "data": {"status": "#" * OBJECT_MAX_BYTES}}
    size = len(json.dumps(status, separators=(",", ":")))
    nodes, job = files(tmp_path, [demo.make_node("n1", {}), status])
    code, err = mutate(capsys, "--nodes", nodes, "-f", job)
    assert code == 2
    assert err.splitlines() == [f"topology-webhook: error: {nodes}: ConfigMap kube-system/cluster-autoscaler-status is "
                                f"{size} bytes as JSON; allowed: at most {OBJECT_MAX_BYTES} bytes (3 MiB, the "
                                "apiserver's request limit)"]


def test_a_manifest_object_over_3_mib_is_refused_though_its_file_is_allowed(tmp_path, capsys):
    job = gpu_job("train", 1, 8)
    job["metadata"]["annotations"]["example.com/notes"] = "é" * (OBJECT_MAX_BYTES // 2)  # 2 bytes each in UTF-8
    nodes, path = files(tmp_path, job=job)
    code, err = mutate(capsys, "--nodes", nodes, "-f", path)
    assert code == 2
    assert len(err.splitlines()) == 1
    assert err.startswith(f"topology-webhook: error: {path}: Job ml/train is ") and "bytes as JSON; allowed" in err


def test_a_resource_slice_with_more_devices_than_the_api_allows_is_refused_as_the_apiserver_would(tmp_path, capsys):
    node = demo.make_node("n1", {}, dra=True)
    nodes, job = files(tmp_path, [node, demo.make_resource_slice("n1", gpus=128)])
    assert mutate(capsys, "--nodes", nodes, "-f", job)[0] == 0  # 128: the most one slice may hold
    too_many = demo.make_resource_slice("n1", gpus=129)
    nodes, job = files(tmp_path, [node, too_many])
    code, err = mutate(capsys, "--nodes", nodes, "-f", job)
    assert code == 2
    assert err.splitlines() == [f"topology-webhook: error: {nodes}: ResourceSlice {too_many['metadata']['name']}: "
                                "spec.devices: Too many: 129: must have at most 128 items"]
    (tmp_path / "pods.yaml").write_text(yaml.safe_dump(too_many))  # in --pods too
    nodes, job = files(tmp_path, [node])
    code, err = mutate(capsys, "--nodes", nodes, "--pods", str(tmp_path / "pods.yaml"), "-f", job)
    assert code == 2 and len(err.splitlines()) == 1 and "spec.devices: Too many: 129" in err, err


# ----- YAML aliases -------------------------------------------------------------------------------

LAUGHS = "\n".join(["  a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
                   + [f"  {b}: &{b} [{', '.join(['*' + a] * 9)}]" for a, b in zip("abcdefgh", "bcdefghi")])


def test_a_billion_laughs_in_a_cluster_file_is_refused_before_anything_expands_it(tmp_path, capsys):
    _, job = files(tmp_path)
    node = yaml.safe_dump(demo.make_node("n1", {}))
    (tmp_path / "nodes.yaml").write_text(f"{node}---\napiVersion: v1\nkind: Node\nmetadata: {{name: n2}}\n"
                                         f"status:\n{LAUGHS}\n")
    code, err = mutate(capsys, "--nodes", str(tmp_path / "nodes.yaml"), "-f", job)
    assert code == 2
    assert err.splitlines() == [f"topology-webhook: error: {tmp_path / 'nodes.yaml'}: document 2: aliases (*name) "
                                "would expand the file by more than 1000000 YAML nodes; allowed: at most 1000000 "
                                "nodes added by aliases per file"]


def test_a_recursive_alias_is_refused_and_aliases_within_bounds_are_read(tmp_path, capsys):
    _, job = files(tmp_path)
    (tmp_path / "nodes.yaml").write_text("apiVersion: v1\nkind: Node\nmetadata: {name: n1}\nstatus: &s\n  s: *s\n")
    code, err = mutate(capsys, "--nodes", str(tmp_path / "nodes.yaml"), "-f", job)
    assert code == 2
    assert err.splitlines() == [f"topology-webhook: error: {tmp_path / 'nodes.yaml'}: document 1 holds an alias "
                                "inside the node it names (a recursive structure, which no Kubernetes object is)"]
    listed = yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": [demo.make_node("n1", {})]}, sort_keys=False)
    copy = "- {apiVersion: v1, kind: Node, metadata: {name: n2}, status: {x: [*m, *m]}}\n"
    (tmp_path / "nodes.yaml").write_text(listed.replace("metadata:", "metadata: &m", 1) + copy)
    assert mutate(capsys, "--nodes", str(tmp_path / "nodes.yaml"), "-f", job)[0] == 0


# ----- linear time ----------------------------------------------------------------------------------

def test_node_groups_are_matched_to_pools_by_name_not_each_against_every_pool(monkeypatch):
    pools = 1000
    nodes = [demo.make_node(f"n{i}", {"cloud.google.com/gke-nodepool": f"pool{i}"}, gpus=1) for i in range(pools)]
    status = {"apiVersion": "v1", "kind": "ConfigMap",
              "metadata": {"name": "cluster-autoscaler-status", "namespace": "kube-system"},
              "data": {"status": yaml.safe_dump({"nodeGroups": [
                  {"name": f"gke-prod-pool{i}-{i:08x}-grp", "health": {"status": "Healthy", "cloudProviderTarget": 1,
                                                                         "minSize": 0, "maxSize": 2}}
                  for i in range(pools)]})}}
    index = index_of(Config(levels=PRESETS["gke"]), [*nodes, status])
    looked_up = []
    runs = growth._dash_runs
    monkeypatch.setattr(growth, "_dash_runs", lambda group: [looked_up.append(r) or r for r in runs(group)])
    grown = index.pools()
    assert len(grown) == pools and {p.name for p in grown} == {f"pool{i}" for i in range(pools)}
    # linear in the status: a few lookups per group (its name's dash runs), where matching each
    # group against each pool took a million regular expressions (68 s on ae693d5)
    assert len(looked_up) <= 15 * pools
