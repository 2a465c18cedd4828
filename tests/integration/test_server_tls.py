"""The real server: gunicorn over TLS, called the way kube-apiserver calls it."""
import json
import os
import pathlib
import socket
import ssl
import threading
import time

import pytest
import requests
import yaml
from cryptography import x509

from webhook.credentials import certs
from webhook.kube import demo

from conftest import assert_valid_kubernetes_object, patched_object, review_of, start_server, stop_server
from tests.fixtures.builders import gpu_job, gpu_pod


@pytest.mark.parametrize("version", ["v1", "v1beta1"])
def test_a_gpu_pod_is_admitted_with_a_patch_that_applies_and_validates(apiserver, version):
    review = review_of(gpu_pod("trainer", 4, placement_strategy="consolidated"), version)
    mutated = apiserver.admit(review)
    assert mutated != review["request"]["object"]
    assert_valid_kubernetes_object(mutated)


def test_a_gpu_job_is_admitted_with_a_patch_that_applies_and_validates(apiserver):
    review = review_of(gpu_job("allreduce", 2, 8, placement_strategy="consolidated"))
    assert_valid_kubernetes_object(apiserver.admit(review))


def test_a_workload_without_gpus_passes_unchanged(apiserver):
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": "ml"},
               "spec": {"ports": [{"port": 80}]}}
    assert apiserver.admit(review_of(service)) == service


def test_body_that_is_not_json_gets_400_with_a_one_line_reason(apiserver):
    response = apiserver.session.post(f"{apiserver.base_url}/mutate?timeout=5s", data=b"\x00garbage",
                                      headers={"Content-Type": "application/json"}, verify=apiserver.ca, timeout=5)
    assert response.status_code == 400
    assert response.text.startswith("request body is not JSON") and response.text.count("\n") == 1


def test_oversized_body_is_refused_with_413_before_it_is_sent(tls_server):
    # Only the headers go out: the answer must come without the server waiting for the body.
    context = ssl.create_default_context(cafile=tls_server.paths.ca)
    with socket.create_connection(("127.0.0.1", tls_server.port), timeout=5) as raw:
        with context.wrap_socket(raw, server_hostname="localhost") as tls:
            tls.sendall(f"POST /mutate?timeout=5s HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                        f"Content-Length: {3 * 1024 * 1024 + 1}\r\n\r\n".encode())
            assert tls.recv(4096).startswith(b"HTTP/1.1 413 ")


def test_readyz_and_metrics_on_their_own_port(tls_server, apiserver):
    assert apiserver.get("/readyz").text == "ok\n"
    apiserver.admit(review_of(gpu_pod("counted", 1)))
    assert apiserver.get("/metrics").status_code == 404  # not on the port the apiserver reaches
    text = tls_server.metrics()
    for name in ("topology_scheduler_latency_seconds_bucket", "topology_placement_decisions_total",
                 "topology_gpu_allocation_ratio", "topology_domain_utilization_ratio",
                 "topology_scheduler_domain_fragmentation_ratio", "topology_admission_fail_open_total"):
        assert name in text


def test_eight_templates_of_twenty_thousand_gpu_init_containers_at_once_are_refused_and_others_still_placed(
        tls_server, apiserver):
    """Issue 59's tenant: eight 1.8 MB reviews at once, as many as the server has threads, each
    answered with the count and the bound, while an ordinary review sent meanwhile is placed.
    How long each takes is measured in bench/flood_bench.py."""
    job = gpu_job("huge", 1, 8, placement_strategy="consolidated")
    job["spec"]["template"]["spec"]["initContainers"] = [
        {"name": f"step-{i}", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
        for i in range(20_000)]
    answers: list = []

    def send_huge() -> None:
        answers.append(requests.post(f"{apiserver.base_url}/mutate?timeout=5s", json=review_of(job),
                                     verify=apiserver.ca, timeout=60))

    senders = [threading.Thread(target=send_huge) for _ in range(8)]
    for sender in senders:
        sender.start()
    ordinary = review_of(gpu_pod("ordinary", 8, placement_strategy="consolidated"))
    answer = apiserver.post(ordinary, 30)
    for sender in senders:
        sender.join()
    assert [answer.status_code for answer in answers] == [200] * 8
    for refused in answers:
        response = refused.json()["response"]
        assert response["allowed"] is False and "patch" not in response
        assert response["status"]["message"].startswith("Job ml/huge: has 20001 containers in its pod templates")
        assert "allowed: at most 256 in all" in response["status"]["message"]
    placed = patched_object(ordinary, answer.json())
    assert "topology.scheduler/placement" in placed["metadata"]["annotations"]


def test_a_client_that_does_not_trust_our_ca_is_refused(tls_server):
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(f"https://localhost:{tls_server.port}/healthz", timeout=5)  # system roots only


# ----- a server on files, certificate rotation ---------------------------------------------------

def kubelet_secret_dir(root: pathlib.Path, ca_cert: bytes, ca_key: bytes, generation: int) -> None:
    """Write a serving pair the way kubelet updates a mounted Secret: a new timestamped directory,
    then one atomic swap of the `..data` symlink that tls.crt and tls.key point through."""
    cert, key = certs.make_serving_cert(ca_cert, ca_key, ["localhost"], ["127.0.0.1"])
    data = root / f"..gen-{generation}"
    data.mkdir()
    (data / "tls.crt").write_bytes(cert)
    (data / "tls.key").write_bytes(key)
    link = root / "..data_tmp"
    link.symlink_to(data.name)
    os.replace(link, root / "..data")
    for name in ("tls.crt", "tls.key"):
        if not (root / name).is_symlink():
            (root / name).symlink_to(f"..data/{name}")


def served_serial(port: int, ca: str) -> int:
    context = ssl.create_default_context(cafile=ca)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        with context.wrap_socket(raw, server_hostname="localhost") as tls:
            return x509.load_der_x509_certificate(tls.getpeercert(binary_form=True)).serial_number


@pytest.fixture(scope="module")
def rotating(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("rotating")
    secret = workdir / "secret"
    secret.mkdir()
    ca_cert, ca_key = certs.make_ca("rotation test CA")
    (workdir / "ca.crt").write_bytes(ca_cert)
    kubelet_secret_dir(secret, ca_cert, ca_key, 1)
    # This server reads its cluster from files, as `kubectl get nodes/pods -o yaml` writes them.
    nodes = demo.leaf_spine_nodes(spines=1, leaves=2, nodes=2, zone="zone-from-file")
    pods = [demo.make_pod("busy", nodes[0]["metadata"]["name"], 8)]
    for name, items in (("nodes.yaml", nodes), ("pods.yaml", pods)):
        (workdir / name).write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": items}))
    server = start_server(workdir, "--nodes", str(workdir / "nodes.yaml"),
                          "--pods", str(workdir / "pods.yaml"), cert=str(secret / "tls.crt"),
                          key=str(secret / "tls.key"), ca=str(workdir / "ca.crt"))
    server.rotate = lambda generation: kubelet_secret_dir(secret, ca_cert, ca_key, generation)
    yield server
    stop_server(server)


def test_serve_places_on_the_cluster_from_the_nodes_and_pods_files(rotating):
    mutated = rotating.client().admit(review_of(gpu_pod("trainer", 8, placement_strategy="consolidated")))
    placement = mutated["metadata"]["annotations"]["topology.scheduler/placement"]
    assert "gpu-s1-l" in placement and "gpu-s1-l1-n1" not in placement  # that node is full (pods.yaml)
    assert "zone-from-file" in json.dumps(mutated["spec"]["affinity"])


def test_rotated_certificate_is_served_to_new_connections_without_failing_a_request(rotating):
    client = rotating.client()
    before = served_serial(rotating.port, client.ca)
    failures, sent, stop = [], [0], threading.Event()

    def keep_sending():  # one kept-alive connection, as the apiserver holds them
        session = requests.Session()
        for number in range(5000):
            if stop.is_set():
                return
            try:
                review = review_of(gpu_pod(f"during-rotation-{number}", 1))
                response = session.post(f"{client.base_url}/mutate?timeout=5s", json=review, verify=client.ca,
                                        timeout=5)
                if response.status_code != 200 or response.json()["response"]["uid"] != review["request"]["uid"]:
                    failures.append(response.text)
            except requests.RequestException as err:
                failures.append(repr(err))
            sent[0] += 1

    sender = threading.Thread(target=keep_sending)
    sender.start()
    try:
        time.sleep(0.5)
        rotating.rotate(2)
        deadline, seen_new = time.monotonic() + 15, 0
        while time.monotonic() < deadline and seen_new < 6:  # and keeps handing it out
            seen_new = seen_new + 1 if served_serial(rotating.port, client.ca) != before else 0
            time.sleep(0.1)
    finally:
        stop.set()
        sender.join(timeout=30)
    assert seen_new >= 6, "new connections still get the old certificate"
    assert sent[0] > 20 and failures == []




# ----- TLS settings: no CBC suites, optional client certificates -----------------------------------

def handshake(port: int, ca: str, ciphers: str | None = None, client: tuple[str, str] | None = None) -> bool:
    context = ssl.create_default_context(cafile=ca)
    if ciphers:
        context.maximum_version = ssl.TLSVersion.TLSv1_2
        context.set_ciphers(ciphers)
    if client:
        context.load_cert_chain(*client)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
            with context.wrap_socket(raw, server_hostname="localhost") as tls:
                tls.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
                return tls.recv(100).startswith(b"HTTP/1.1 200")  # TLS 1.3 verifies the client here
    except (ssl.SSLError, ConnectionResetError):
        return False


def test_tls12_offers_aead_suites_only(tls_server):
    assert handshake(tls_server.port, tls_server.paths.ca, "ECDHE-RSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES128-GCM-SHA256")
    assert not handshake(tls_server.port, tls_server.paths.ca, "ECDHE-RSA-AES128-SHA:ECDHE-RSA-AES256-SHA:"
                                                                "ECDHE-ECDSA-AES128-SHA:ECDHE-ECDSA-AES256-SHA:"
                                                                "AES128-SHA:AES256-SHA")


def client_certificate(directory: pathlib.Path, ca_cert: bytes, ca_key: bytes) -> tuple[str, str]:
    """A client certificate (clientAuth) signed by the CA, as the apiserver's kubeconfig holds one."""
    import datetime

    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    issuer = x509.load_pem_x509_certificate(ca_cert)
    signer = serialization.load_pem_private_key(ca_key, password=None)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "apiserver")]))
            .issuer_name(issuer.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=1)).not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(signer, hashes.SHA256()))
    paths = (str(directory / "client.crt"), str(directory / "client.key"))
    pathlib.Path(paths[0]).write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pathlib.Path(paths[1]).write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                         serialization.PrivateFormat.PKCS8,
                                                         serialization.NoEncryption()))
    return paths


def test_with_client_ca_only_clients_with_a_certificate_it_signed_are_served(tmp_path):
    ca_cert, ca_key = certs.make_ca("apiserver client CA")
    (tmp_path / "client-ca.crt").write_bytes(ca_cert)
    trusted = client_certificate(tmp_path, ca_cert, ca_key)
    other_dir = tmp_path / "other"
    other_dir.mkdir()
    stranger = client_certificate(other_dir, *certs.make_ca("someone else"))
    server = start_server(tmp_path, "--client-ca", str(tmp_path / "client-ca.crt"), client_cert=trusted)
    try:
        assert handshake(server.port, server.paths.ca, client=trusted)
        assert not handshake(server.port, server.paths.ca)
        assert not handshake(server.port, server.paths.ca, client=stranger)
        # kubelet's probes carry no client certificate: they use the plain metrics port
        probes = f"http://127.0.0.1:{server.metrics_port}"
        assert requests.get(f"{probes}/readyz", timeout=5).text == "ok\n"
        assert requests.get(f"{probes}/healthz", timeout=5).status_code == 200
        assert requests.post(f"{probes}/mutate", json={}, timeout=5).status_code == 404
    finally:
        stop_server(server)


def test_a_replaced_client_ca_is_trusted_from_the_next_connection_without_a_restart(tmp_path):
    """The chart mounts the client CA from a ConfigMap, which kubelet swaps in place when it changes."""
    old_ca, old_key = certs.make_ca("client CA before rotation")
    new_ca, new_key = certs.make_ca("client CA after rotation")
    (tmp_path / "client-ca.crt").write_bytes(old_ca)
    (tmp_path / "old").mkdir()
    (tmp_path / "new").mkdir()
    before = client_certificate(tmp_path / "old", old_ca, old_key)
    after = client_certificate(tmp_path / "new", new_ca, new_key)
    server = start_server(tmp_path, "--client-ca", str(tmp_path / "client-ca.crt"), client_cert=before)
    try:
        assert handshake(server.port, server.paths.ca, client=before)
        assert not handshake(server.port, server.paths.ca, client=after)
        certs.write_atomically(str(tmp_path / "client-ca.crt"), new_ca, 0o644)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not handshake(server.port, server.paths.ca, client=after):
            time.sleep(0.2)
        assert handshake(server.port, server.paths.ca, client=after)
        assert not handshake(server.port, server.paths.ca, client=before)
    finally:
        stop_server(server)


# ----- reservations are namespaced ----------------------------------------------------------------

def reserved_gpus(server) -> float:
    line = next(line for line in server.metrics().splitlines()
                if line.startswith('topology_cluster_gpus{state="reserved"}'))
    return float(line.split()[-1])


def test_a_pod_of_another_namespace_cannot_replace_or_release_a_reservation(tls_server, apiserver):
    victim = gpu_job("victim-train", 2, 8, namespace="team-victim", placement_strategy="consolidated")
    assert "topology.scheduler/reservation" in json.dumps(apiserver.admit(review_of(victim)))
    held = reserved_gpus(tls_server)
    crafted = gpu_pod("x", 1, namespace="attacker",
                      reservation="team-victim/Job/victim-train", placement_strategy="consolidated")
    crafted["metadata"] = {**crafted["metadata"], "generateName": "x-"}
    del crafted["metadata"]["name"]
    mutated = apiserver.admit(review_of(crafted))
    assert mutated["metadata"]["annotations"]["topology.scheduler/reservation"].startswith("attacker/Pod/x-")
    assert reserved_gpus(tls_server) == held + 1  # its own hold, next to the victim's
    # Nor can a DELETE carrying the victim's key from another namespace release it.
    deletion = review_of(gpu_job("victim-train", 2, 8, namespace="attacker",
                                 reservation="team-victim/Job/victim-train"))
    deletion["request"].update(operation="DELETE", oldObject=deletion["request"]["object"], object=None)
    answer = apiserver.post(deletion).json()["response"]
    assert answer["allowed"] and reserved_gpus(tls_server) == held + 1


def test_an_oversized_chunked_body_is_refused_with_413(tls_server):
    context = ssl.create_default_context(cafile=tls_server.paths.ca)
    chunk = b"x" * 65536
    with socket.create_connection(("127.0.0.1", tls_server.port), timeout=10) as raw:
        with context.wrap_socket(raw, server_hostname="localhost") as tls:
            tls.sendall(b"POST /mutate?timeout=5s HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                        b"Transfer-Encoding: chunked\r\n\r\n")
            try:
                for _ in range(64):  # 4 MiB, past the 3 MiB limit
                    tls.sendall(b"%x\r\n" % len(chunk) + chunk + b"\r\n")
                tls.sendall(b"0\r\n\r\n")
            except OSError:
                pass  # the server may answer and close before the whole body is sent
            assert tls.recv(4096).startswith(b"HTTP/1.1 413 ")


# ----- one replica never double-books, whatever its cluster source -------------------------------

def test_a_file_cluster_never_gives_a_node_twice_to_sequential_or_concurrent_admissions(tmp_path):
    from concurrent.futures import ThreadPoolExecutor
    nodes = demo.leaf_spine_nodes(spines=1, leaves=2, nodes=3, zone="z")  # 6 idle 8-GPU nodes
    (tmp_path / "nodes.yaml").write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": nodes}))
    server = start_server(tmp_path, "--nodes", str(tmp_path / "nodes.yaml"))
    try:
        client = server.client()

        def admit(name: str) -> dict:
            job = gpu_job(name, 1, 8, gpu_count="8", placement_strategy="consolidated")
            return client.post(review_of(job)).json()["response"]["auditAnnotations"]

        sequential = [admit(f"one-by-one-{i}") for i in range(2)]
        with ThreadPoolExecutor(max_workers=12) as pool:
            concurrent = list(pool.map(admit, [f"burst-{i}" for i in range(12)]))
        placed = [a["domain"] for a in sequential + concurrent if a["outcome"] == "placed"]
        assert len(placed) == 6 and len(set(placed)) == 6, placed
        assert sum(a["outcome"] == "waiting" for a in concurrent) == 8
    finally:
        stop_server(server)
