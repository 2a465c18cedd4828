"""Slow, silent and hostile clients against the real server (gunicorn over TLS on 127.0.0.1), and
the log it writes meanwhile."""
import json
import socket
import ssl
import threading
import time

import pytest
import requests

from webhook.serving.server import REQUEST_SECONDS

from conftest import review_of, start_server, stop_server
from tests.fixtures.builders import gpu_pod

HELD = 64  # of each kind


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    running = start_server(tmp_path_factory.mktemp("slow-clients"))
    yield running
    stop_server(running)


def tls_connection(server) -> ssl.SSLSocket:
    context = ssl.create_default_context(cafile=server.paths.ca)
    raw = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    return context.wrap_socket(raw, server_hostname="localhost")


def test_silent_and_trickling_connections_do_not_delay_normal_reviews(server):
    silent = [tls_connection(server) for _ in range(HELD)]  # handshake done, then nothing
    trickling = [tls_connection(server) for _ in range(HELD)]
    half_hello = [socket.create_connection(("127.0.0.1", server.port), timeout=10) for _ in range(16)]
    for conn in half_hello:
        conn.sendall(b"\x16\x03\x01\x02\x00")  # the first 5 bytes of a TLS ClientHello, then nothing
    stop = threading.Event()

    def trickle():  # headers that never end, one byte per connection every 0.1 s
        for conn in trickling:
            conn.sendall(b"POST /mutate HTTP/1.1\r\nHost: localhost\r\n")
        while not stop.wait(0.1):
            for conn in trickling:
                try:
                    conn.sendall(b"x")
                except OSError:
                    pass  # the server dropped it at its deadline

    trickler = threading.Thread(target=trickle)
    trickler.start()
    slowest, answered = 0.0, 0
    try:
        session = requests.Session()
        for number in range(100):
            review = review_of(gpu_pod(f"normal-{number}", 1))
            # Every tenth on a fresh connection: new connections must be accepted too.
            headers = {"Connection": "close"} if number % 10 == 0 else {}
            started = time.monotonic()
            response = session.post(f"https://localhost:{server.port}/mutate?timeout=5s", json=review,
                                    verify=server.paths.ca, timeout=5, headers=headers)
            slowest = max(slowest, time.monotonic() - started)
            assert response.status_code == 200
            assert response.json()["response"]["uid"] == review["request"]["uid"]
            answered += 1
    finally:
        stop.set()
        trickler.join(timeout=30)
        for conn in silent + trickling + half_hello:
            conn.close()
    assert answered == 100
    assert slowest < 1.0, f"a normal review took {slowest:.2f} s while {2 * HELD} connections were held"


def test_a_silent_connection_is_closed_at_the_request_deadline(server):
    conn = tls_connection(server)
    conn.settimeout(REQUEST_SECONDS + 20)
    started = time.monotonic()
    try:
        assert conn.recv(1) == b""  # closed by the server, not answered
    except (ConnectionResetError, ssl.SSLError):
        pass
    finally:
        conn.close()
    assert time.monotonic() - started < REQUEST_SECONDS + 20


def test_a_plain_http_client_on_the_tls_port_is_dropped_without_holding_anything(server):
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw:
        raw.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        try:
            answer = raw.recv(100)
        except ConnectionResetError:
            answer = b""
    assert answer == b""  # the handshake fails and the connection is closed, unanswered
    assert requests.get(f"https://localhost:{server.port}/healthz", verify=server.paths.ca, timeout=5).ok


def test_every_log_line_under_load_is_a_json_object_with_time_and_level(server):
    url = f"https://localhost:{server.port}/mutate?timeout=5s"
    hostile = gpu_pod("line\nbreak\"}{forged", 1)

    def load(sender: int) -> None:  # four kept-alive connections at once
        session = requests.Session()
        for number in range(10):
            session.post(url, json=review_of(gpu_pod(f"logged-{sender}-{number}", 2)), verify=server.paths.ca,
                         timeout=5)

    senders = [threading.Thread(target=load, args=(i,)) for i in range(4)]
    for sender in senders:
        sender.start()
    for sender in senders:
        sender.join(timeout=60)
    session = requests.Session()
    session.post(url, json=review_of(hostile), verify=server.paths.ca, timeout=5)
    session.post(url, data=b"not json", headers={"Content-Type": "application/json"}, verify=server.paths.ca,
                 timeout=5)
    deep = review_of(gpu_pod("deep", 1))
    nested: dict = {}
    deep["request"]["object"]["metadata"]["annotations"] = {"x": "y"}
    deep["request"]["object"]["spec"]["extra"] = nested
    for _ in range(500):
        nested["n"] = {}
        nested = nested["n"]
    session.post(url, json=deep, verify=server.paths.ca, timeout=5)
    time.sleep(0.5)  # the worker flushes its last lines
    lines = server.log.read_text().splitlines()
    assert len(lines) > 40
    for line in lines:
        entry = json.loads(line)
        assert isinstance(entry, dict) and entry["time"].endswith("Z") and entry["level"] in (
            "debug", "info", "warning", "error", "critical")
    assert {"webhook.cli", "gunicorn.error", "webhook.admission"} <= {json.loads(line)["logger"] for line in lines}
    names = [json.loads(line).get("name") for line in lines]
    assert hostile["metadata"]["name"] in names  # escaped inside its line, not a line of its own
    assert len(lines) < 200  # the deep object wrote a bounded number of lines


# ----- the metrics port --------------------------------------------------------------------------

SILENT_ON_METRICS = 256


@pytest.fixture
def many_files():
    """Room for the held connections' both ends in this one process."""
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 4 * SILENT_ON_METRICS + 256
    if soft != resource.RLIM_INFINITY and soft < wanted:
        if hard != resource.RLIM_INFINITY and hard < wanted:
            pytest.skip(f"RLIMIT_NOFILE hard limit {hard} < {wanted}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.mark.parametrize("tls", [False, True], ids=["http", "https"])
def test_metrics_answer_within_a_second_while_hundreds_of_silent_connections_are_held(many_files, tmp_path, tls):
    from webhook.credentials import certs
    from webhook.credentials.certs import ReloadingContext
    from webhook.serving.metrics import Metrics
    from webhook.serving.metrics_port import METRICS_REQUEST_SECONDS, start_metrics_server

    def webhook_app(_environ, start_response):
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"ok\n"]

    paths = certs.write_certs(str(tmp_path / "tls"), "topology-webhook", "default")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1024)
    port = listener.getsockname()[1]
    server = start_metrics_server(listener, Metrics.create().registry, webhook_app,
                                  tls=ReloadingContext(paths.cert, paths.key).current if tls else None)
    url = f"{'https' if tls else 'http'}://localhost:{port}/metrics"
    silent = []
    try:
        silent = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(SILENT_ON_METRICS)]
        time.sleep(0.2)  # all accepted and waiting for a request that never comes
        started = time.monotonic()
        response = requests.get(url, verify=paths.ca, timeout=10)
        took = time.monotonic() - started
        assert response.status_code == 200 and "topology_webhook_build_info" in response.text
        assert took < 1.0, f"/metrics took {took:.2f} s beside {SILENT_ON_METRICS} silent connections"
        silent[0].settimeout(METRICS_REQUEST_SECONDS + 5)
        assert silent[0].recv(1) == b""  # closed unanswered about a second after it was accepted
    finally:
        for conn in silent:
            conn.close()
        server.stop()
        listener.close()
