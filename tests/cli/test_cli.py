"""The command line as users script it: mutate for CI, certs, serve's argument checks."""
import base64
import io
import json
import socket
import subprocess
import sys

import jsonpatch
import pytest
import yaml

from webhook.kube import demo
from webhook.cli import EXIT_STDOUT_CLOSED, main

from conftest import ROOT, assert_valid_kubernetes_object
from tests.fixtures.builders import gpu_job, gpu_pod

FIXTURES = ROOT / "tests" / "fixtures"

SERVICE = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": "ml"},
           "spec": {"ports": [{"port": 80}]}}


@pytest.fixture
def cluster_files():
    """The demo cluster as `kubectl get nodes -o yaml` and `kubectl get pods -A -o yaml` print it
    (the files the README walk-through uses)."""
    return ["--nodes", str(FIXTURES / "demo-nodes.yaml"), "--pods", str(FIXTURES / "demo-pods.yaml")]


def test_the_demo_cluster_files_are_the_built_in_demo_cluster():
    nodes, pods = demo.demo_cluster()
    assert yaml.safe_load((FIXTURES / "demo-nodes.yaml").read_text())["items"] == nodes
    assert yaml.safe_load((FIXTURES / "demo-pods.yaml").read_text())["items"] == pods


def write(tmp_path, name, *objects):
    path = tmp_path / name
    path.write_text(yaml.safe_dump_all(objects, sort_keys=False))
    return str(path)


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_mutate_prints_every_object_mutated_or_unchanged_as_yaml(tmp_path, capsys, cluster_files):
    manifest = write(tmp_path, "workloads.yaml", gpu_job("allreduce", 2, 8, placement_strategy="consolidated"),
                     SERVICE)
    code, out, err = run(capsys, "mutate", "-f", manifest, *cluster_files)
    assert code == 0, err
    job, service = list(yaml.safe_load_all(out))
    assert job != gpu_job("allreduce", 2, 8, placement_strategy="consolidated")
    assert_valid_kubernetes_object(job)
    assert service == SERVICE


def test_mutate_writes_every_object_out_where_it_stands_even_from_anchored_yaml(tmp_path, capsys, cluster_files):
    """The output shares what the mutation left alone with the manifest read, and an anchor there
    makes one object stand in two places: the YAML printed spells out both, as before."""
    manifest = tmp_path / "anchored.yaml"
    manifest.write_text(
        "apiVersion: batch/v1\nkind: Job\nmetadata: {name: train, namespace: ml, annotations: "
        "{topology.scheduler/placement-strategy: consolidated}}\nspec:\n  template:\n    spec:\n"
        "      restartPolicy: Never\n      containers:\n      - {name: main, image: trainer, securityContext: "
        "&locked {runAsNonRoot: true}, resources: {limits: {nvidia.com/gpu: '8'}}}\n"
        "      - {name: log, image: shipper, securityContext: *locked}\n")
    code, out, err = run(capsys, "mutate", "-f", str(manifest), *cluster_files)
    assert code == 0, err
    assert "&" not in out and "*" not in out
    containers = yaml.safe_load(out)["spec"]["template"]["spec"]["containers"]
    assert [c["securityContext"] for c in containers] == [{"runAsNonRoot": True}] * 2


def test_mutate_patch_output_is_one_kubectl_json_patch_per_line_giving_the_json_output(tmp_path, capsys,
                                                                                      cluster_files):
    job, pod = gpu_job("allreduce", 2, 8, placement_strategy="consolidated"), gpu_pod("single", 1)
    manifest = write(tmp_path, "job.yaml", job, pod)
    code, out, _ = run(capsys, "mutate", "-f", manifest, "-o", "patch", *cluster_files)
    assert code == 0
    lines = out.splitlines()
    assert len(lines) == 2
    patches = [json.loads(line) for line in lines]
    assert all(isinstance(p, list) and all({"op", "path"} <= set(op) for op in p) for p in patches)
    code, out, _ = run(capsys, "mutate", "-f", manifest, "-o", "json", *cluster_files)
    assert [jsonpatch.apply_patch(obj, p) for obj, p in zip((job, pod), patches)] == json.loads(out)["items"]


def test_mutate_reads_a_directory_as_kubectl_does(tmp_path, capsys, cluster_files):
    folder = tmp_path / "manifests"
    (folder / "nested").mkdir(parents=True)
    write(folder, "b.yaml", gpu_pod("second", 1))
    write(folder, "a.json", gpu_pod("first", 1))
    write(folder, "notes.txt", gpu_pod("not-a-manifest", 1))
    write(folder / "nested", "c.yaml", gpu_pod("nested", 1))
    code, out, err = run(capsys, "mutate", "-f", str(folder), "-o", "json", *cluster_files)
    assert code == 0, err
    assert [p["metadata"]["name"] for p in json.loads(out)["items"]] == ["first", "second"]


def test_mutate_reads_yaml_documents_from_stdin(capsys, cluster_files, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO(yaml.safe_dump_all([gpu_pod("a", 1), SERVICE])))
    code, out, _ = run(capsys, "mutate", "-f", "-", *cluster_files)
    assert code == 0 and [o["metadata"]["name"] for o in yaml.safe_load_all(out)] == ["a", "web"]


@pytest.mark.parametrize("content", ["", "---\n", "# only a comment\n"])
def test_mutate_of_an_empty_file_says_no_objects_were_passed(tmp_path, capsys, cluster_files, content):
    (tmp_path / "empty.yaml").write_text(content)
    code, out, err = run(capsys, "mutate", "-f", str(tmp_path / "empty.yaml"), *cluster_files)
    assert code == 2 and out == "" and "no objects passed to mutate" in err and len(err.splitlines()) == 1


def test_mutate_reads_a_json_list_from_stdin(capsys, cluster_files, monkeypatch):
    listing = {"apiVersion": "v1", "kind": "List", "items": [gpu_pod("a", 1), gpu_pod("b", 2)]}
    monkeypatch.setattr(sys, "stdin", io.StringIO(json.dumps(listing)))
    code, out, _ = run(capsys, "mutate", "-f", "-", "-o", "json", *cluster_files)
    assert code == 0
    result = json.loads(out)
    assert result["kind"] == "List" and [p["metadata"]["name"] for p in result["items"]] == ["a", "b"]


def test_workloads_of_one_run_see_each_others_reservations(tmp_path, capsys, cluster_files):
    # The demo cluster has 166 free GPUs: the second 96-GPU job only fits once the first is gone.
    first = gpu_job("first", 12, 8, placement_strategy="consolidated")
    second = gpu_job("second", 12, 8, placement_strategy="consolidated")
    code, _, alone = run(capsys, "mutate", "-f", write(tmp_path, "second.yaml", second), *cluster_files)
    assert code == 0 and "Warning" not in alone
    code, _, together = run(capsys, "mutate", "-f", write(tmp_path, "first.yaml", first),
                            "-f", write(tmp_path, "second.yaml", second), *cluster_files)
    assert code == 0
    assert "Warning: Job ml/second" in together and "Warning: Job ml/first" not in together


def test_a_denied_workload_exits_1_naming_it_while_the_others_are_printed(tmp_path, capsys, cluster_files):
    manifest = write(tmp_path, "mixed.yaml", gpu_pod("huge", 64, gpu_count="64"), gpu_pod("small", 1, gpu_count="1"))
    code, out, err = run(capsys, "mutate", "-f", manifest, *cluster_files)
    assert code == 1
    assert "Error: Pod ml/huge denied:" in err and "ml/small" not in err
    assert [obj["metadata"]["name"] for obj in yaml.safe_load_all(out)] == ["small"]


def test_explain_prints_each_decision_with_its_reasons(tmp_path, capsys, cluster_files):
    manifest = write(tmp_path, "job.yaml", gpu_job("allreduce", 2, 8, placement_strategy="consolidated"))
    code, _, err = run(capsys, "mutate", "-f", manifest, "--explain", *cluster_files)
    assert code == 0
    lines = err.splitlines()
    assert lines[0].startswith("Job ml/allreduce: placed in ")
    assert lines[1].startswith("  - ")


def test_explain_of_a_denied_workload_puts_its_reasons_under_the_error_line(tmp_path, capsys, cluster_files):
    settings = tmp_path / "settings.yaml"
    settings.write_text("refuse_unplaceable: true\n")
    manifest = write(tmp_path, "job.yaml", gpu_job("huge", 512, 8, gpu_count="4096"))
    code, _, err = run(capsys, "mutate", "-f", manifest, "--explain", "--config", str(settings), *cluster_files)
    assert code == 1
    lines = err.splitlines()
    assert lines[0].startswith("Error: Job ml/huge denied: ") and len(lines) > 1
    assert all(line.startswith("  - ") for line in lines[1:])


@pytest.mark.parametrize("content, message", [
    ("kind: [unclosed", "not valid YAML or JSON"),
    ("- 1\n- 2\n", "document 1 item 1 is not a Kubernetes object"),
    ("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\n", "Pod p found; this file may only hold Node objects"),
    ("kind: Node\nmetadata: {name: n}\nspec: 5\n", "document 1 (Node): spec is 5, not a mapping"),
])
def test_bad_nodes_file_gives_one_line_naming_the_file_and_exit_2(tmp_path, capsys, content, message):
    nodes = tmp_path / "nodes.yaml"
    nodes.write_text(content)
    code, out, err = run(capsys, "mutate", "-f", write(tmp_path, "pod.yaml", gpu_pod("p", 1)), "--nodes", str(nodes))
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and str(nodes) in err and message in err


def test_missing_manifest_file_exits_2(tmp_path, capsys, cluster_files):
    code, _, err = run(capsys, "mutate", "-f", str(tmp_path / "absent.yaml"), *cluster_files)
    assert code == 2
    assert err == f"topology-webhook: error: {tmp_path / 'absent.yaml'}: No such file or directory\n"


def test_bad_config_file_exits_2_naming_the_setting(tmp_path, capsys, cluster_files):
    config = tmp_path / "config.yaml"
    config.write_text("levels: nosuchpreset\n")
    code, _, err = run(capsys, "mutate", "-f", write(tmp_path, "p.yaml", gpu_pod("p", 1)), "--config", str(config),
                       *cluster_files)
    assert code == 2 and "nosuchpreset" in err and err.count("\n") == 1


def test_certs_writes_the_pair_and_prints_the_ca_bundle(tmp_path, capsys):
    code, out, _ = run(capsys, "certs", "--service", "topology-webhook", "--namespace", "gpu-system",
                       "--out", str(tmp_path))
    assert code == 0
    assert base64.b64decode(out.strip()) == (tmp_path / "ca.crt").read_bytes()
    assert (tmp_path / "tls.crt").exists() and (tmp_path / "tls.key").exists()


def test_certs_refuses_to_replace_an_existing_ca_without_force(tmp_path, capsys):
    argv = ("certs", "--service", "topology-webhook", "--namespace", "gpu-system", "--out", str(tmp_path))
    assert run(capsys, *argv)[0] == 0
    first = (tmp_path / "ca.crt").read_bytes()
    code, _, err = run(capsys, *argv)
    assert code == 2 and "ca.crt exists" in err and "--force" in err and len(err.splitlines()) == 1
    assert (tmp_path / "ca.crt").read_bytes() == first
    assert run(capsys, *argv, "--force")[0] == 0
    assert (tmp_path / "ca.crt").read_bytes() != first


def test_certs_refuses_a_service_name_that_is_not_a_dns_label(tmp_path, capsys):
    code, _, err = run(capsys, "certs", "--service", "Topology_Webhook", "--namespace", "x", "--out", str(tmp_path))
    assert code == 2 and "--service 'Topology_Webhook' is not a DNS label" in err


@pytest.mark.parametrize("argv, message", [
    (["--bind", "8443"], "--bind '8443' is not HOST:PORT"),
    (["--bind", "0.0.0.0:99999"], "--bind '0.0.0.0:99999' is not HOST:PORT"),
    (["--bind", "0.0.0.0:\u00b2"], "is not HOST:PORT"),  # a digit to str.isdigit, not to int()
    (["--cert", "tls.crt"], "--cert and --key go together"),
    (["--workers", "0"], "--workers 0: serve runs exactly 1 worker process"),
    (["--workers", "2"], "--workers 2: serve runs exactly 1 worker process"),  # the demo cluster
    (["--nodes", "nodes.yaml", "--workers", "4"], "a second would book the same GPUs again"),
    (["--metrics-bind", "9090"], "--metrics-bind '9090' is not HOST:PORT"),
    (["--client-ca", "missing-ca.crt"], "--client-ca missing-ca.crt: no such file"),
    (["--cert", "missing.crt", "--key", "missing.key"], "certificate file missing.crt: not found"),
    (["--pods", "pods.yaml"], "--pods needs --nodes"),
    (["--kubeconfig", "kubeconfig", "--nodes", "nodes.yaml"], "give one or the other"),
    (["--kubeconfig", "missing.yaml"], "kubeconfig missing.yaml"),
    (["--kubeconfig", "kubeconfig", "--workers", "2"], "a second would book the same GPUs again"),
    (["--metrics-secure"], "--metrics-secure has the cluster check each reader's token: it needs the live cluster"),
])
def test_serve_refuses_bad_arguments_before_starting(capsys, tmp_path, monkeypatch, argv, message):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    code, _, err = run(capsys, "serve", *argv)
    assert code == 2 and message in err
    assert len(err.splitlines()) == 1 and "serving" not in err  # one line, and nothing started


def test_serve_in_a_pod_without_files_watches_the_api_and_says_when_it_cannot(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    code, _, err = run(capsys, "serve")
    assert code == 2 and "in-cluster config" in err and len(err.strip().splitlines()) <= 2


@pytest.mark.parametrize("flag", ["--bind", "--metrics-bind"])
def test_serve_on_a_port_in_use_says_so_in_one_line(capsys, tmp_path, monkeypatch, flag):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, _, err = run(capsys, "serve", flag, f"127.0.0.1:{port}")
    assert code == 2 and len(err.splitlines()) == 1
    assert f"{flag} 127.0.0.1:{port}: cannot listen there" in err and f"choose another with {flag}" in err


def test_serve_help_says_one_worker_and_why():
    # Through `python -m webhook`, as users and the Helm chart start it.
    result = subprocess.run([sys.executable, "-m", "webhook", "serve", "--help"], cwd=ROOT, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0
    assert "only 1 is allowed" in " ".join(result.stdout.split())


@pytest.mark.parametrize("output", ["json", "yaml"])
def test_mutate_piped_into_a_reader_that_stops_early_ends_quietly_with_141(tmp_path, output):
    # `mutate -o json | head -c 300`: the reader closes the pipe long before the output (far more than a
    # pipe's buffer) is written. No traceback, and not exit 1, which says "denied".
    services = [{**SERVICE, "metadata": {"name": f"web-{i}", "namespace": "ml",
                                         "annotations": {"note": "x" * 200}}} for i in range(2000)]
    manifest = write(tmp_path, "many.yaml", *services)
    with subprocess.Popen([sys.executable, "-m", "webhook", "mutate", "-f", manifest, "-o", output,
                           "--nodes", str(FIXTURES / "demo-nodes.yaml")],
                          cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        head = proc.stdout.read(300)
        proc.stdout.close()
        err = proc.stderr.read().decode()
        code = proc.wait(timeout=60)
    assert len(head) == 300
    assert "Traceback" not in err and "BrokenPipe" not in err and "Exception ignored" not in err, err
    assert code == EXIT_STDOUT_CLOSED == 141


SEED_WORKLOADS = ["002-gpu-job.yaml", "002-multi-gpu-job.yaml", "002-multi-node-training.yaml",
                  "002-single-gpu-job.yaml", "002-gpu-inference-service.yaml"]


def test_the_readme_walkthrough_explains_the_seed_manifests(capsys, cluster_files):
    files = [arg for name in SEED_WORKLOADS for arg in ("-f", str(ROOT / "tests" / "fixtures" / "seeds" / name))]
    code, out, err = run(capsys, "mutate", *files, "--explain", *cluster_files)
    # The seed's multi-node-training Job has no pod template: denied, named, and the run exits 1.
    assert code == 1
    assert "Error: Job default/multi-node-training denied: " in err and "spec.template.spec is missing" in err
    # ... said once: the Error line is its --explain headline, as the README shows (no second "denied" line).
    assert [line for line in err.splitlines() if "multi-node-training" in line] == [
        next(line for line in err.splitlines() if line.startswith("Error: Job default/multi-node-training"))]
    objects = list(yaml.safe_load_all(out))
    assert [o["metadata"]["name"] for o in objects] == ["gpu-job", "multi-gpu-job", "single-gpu-job",
                                                         "gpu-inference-service"]
    for obj in objects:
        assert f"{obj['kind']} default/{obj['metadata']['name']}: placed" in err
    for job in objects[:3]:  # the seed's Deployment lacks spec.selector, so only the Jobs can validate
        assert_valid_kubernetes_object(job)


def test_a_job_larger_than_the_cluster_is_admitted_to_wait_and_refused_only_when_told(tmp_path, capsys, cluster_files):
    """No autoscaler in sight: 40 x 8 GPUs on 32 nodes of 8 waits Pending for nodes to be added,
    as Kubernetes itself would keep it; `refuse_unplaceable: true` (a cluster that never grows)
    refuses it; an invalid annotation is refused either way."""
    big = gpu_job("big", 40, 8, placement_strategy="consolidated")
    manifest = write(tmp_path, "big.yaml", big)
    code, out, err = run(capsys, "mutate", "-f", manifest, *cluster_files)
    assert code == 0, err
    assert "Warning: Job ml/big needs 40 pod(s) x 8 GPU(s); even with every GPU free the nodes it may use hold 32" in err
    assert "it waits for nodes to be added" in err
    (job,) = yaml.safe_load_all(out)
    assert_valid_kubernetes_object(job)
    assert "affinity" not in job["spec"]["template"]["spec"]  # nothing keeps added nodes out
    assert "waiting (consolidated) for nodes to be added" in \
        job["spec"]["template"]["metadata"]["annotations"]["topology.scheduler/placement"]
    settings = tmp_path / "config.yaml"
    settings.write_text("refuse_unplaceable: true\n")
    code, out, err = run(capsys, "mutate", "-f", manifest, *cluster_files, "--config", str(settings))
    assert code == 1 and "Error: Job ml/big denied: " in err and out == ""
    bad = write(tmp_path, "bad.yaml", gpu_job("bad", 40, 8, placement_strategy="packed"))
    code, _, err = run(capsys, "mutate", "-f", bad, *cluster_files)
    assert code == 1 and 'placement-strategy="packed"' in err
