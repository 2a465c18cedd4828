"""SIGHUP and the metrics port: the server reloads without dropping a review, and the plain-HTTP
port holds a bounded number of threads whatever its clients do."""
import signal
import socket
import threading
import time

import requests
from conftest import eventually, review_of, start_server, stop_server

from tests.fixtures.builders import gpu_pod
from webhook.serving.metrics_port import start_metrics_server


def test_sighup_under_load_reloads_the_worker_and_every_review_is_answered(tmp_path):
    server = start_server(tmp_path)
    answers, failures = [], []
    stop = threading.Event()

    def load():
        number = 0
        while not stop.is_set():
            review = review_of(gpu_pod(f"hup-{number}", 1))
            number += 1
            try:  # a fresh connection each time, as a new apiserver request may arrive any moment
                response = requests.post(f"https://localhost:{server.port}/mutate?timeout=10s", json=review,
                                         verify=server.paths.ca, timeout=10, headers={"Connection": "close"})
                ok = response.status_code == 200 and response.json()["response"]["uid"] == review["request"]["uid"]
                (answers if ok else failures).append(response.status_code)
            except requests.RequestException as err:
                failures.append(repr(err))

    workers = [threading.Thread(target=load) for _ in range(3)]
    try:
        for worker in workers:
            worker.start()
        for _ in range(2):
            time.sleep(2.0)
            server.process.send_signal(signal.SIGHUP)
        time.sleep(3.0)
        stop.set()
        for worker in workers:
            worker.join(timeout=30)
        assert server.process.poll() is None, server.log.read_text()[-3000:]
        assert not failures, failures[:5]
        assert len(answers) > 20
        assert requests.get(f"http://127.0.0.1:{server.metrics_port}/healthz", timeout=5).status_code == 200
        assert server.log.read_text().count("Booting worker") >= 3  # the first, then one per SIGHUP
    finally:
        stop.set()
        stop_server(server)


def test_sighup_takes_the_settings_file_as_it_is_now_and_keeps_the_old_settings_after_a_bad_edit(tmp_path):
    settings = tmp_path / "config.yaml"
    settings.write_text("default_scheduler: default-scheduler\n")
    server = start_server(tmp_path, "--config", str(settings))
    pod = gpu_pod("ours", 1)
    pod["spec"]["schedulerName"] = "topology-aware-scheduler"

    def scheduler_written() -> str:
        return server.client().admit(review_of(pod))["spec"]["schedulerName"]

    def after_sighup() -> str:
        booted = server.log.read_text().count("Booting worker")
        server.process.send_signal(signal.SIGHUP)
        eventually(lambda: server.log.read_text().count("Booting worker") > booted, what="a new worker")
        time.sleep(1.0)  # the old worker finishes and leaves the socket to the new one
        return scheduler_written()

    try:
        assert scheduler_written() == "default-scheduler"
        settings.write_text("default_scheduler: second-scheduler\n")
        assert after_sighup() == "second-scheduler"
        settings.write_text("default_scheduler: 'Not A Name'\n")
        assert after_sighup() == "second-scheduler"  # the bad edit is logged, the last good settings kept
        assert "keeping the settings in use" in server.log.read_text()
        assert server.process.poll() is None
    finally:
        stop_server(server)


def test_the_metrics_port_holds_bounded_threads_and_closes_silent_connections_at_the_deadline():
    def webhook_app(_environ, start_response):
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"ok\n"]

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(256)
    port = listener.getsockname()[1]
    before = threading.active_count()
    start_metrics_server(listener, _registry(), webhook_app, threads=4, deadline_seconds=1.0)
    silent = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(40)]
    trickling = silent[:10]
    for conn in trickling:
        conn.sendall(b"GET /healthz HTTP/1.1\r\n")
    try:
        time.sleep(0.5)
        assert threading.active_count() - before <= 4 + 2  # handlers, the accept loop, the watchdog
        started = time.monotonic()
        response = requests.get(f"http://127.0.0.1:{port}/healthz", timeout=30)
        assert response.status_code == 200
        # Forty held connections, four at a time, each closed one second after it was accepted.
        assert time.monotonic() - started < 20
        silent[0].settimeout(5)
        assert silent[0].recv(1) == b""  # closed by the server at its deadline
    finally:
        for conn in silent:
            conn.close()


def _registry():
    from prometheus_client import CollectorRegistry
    return CollectorRegistry()
