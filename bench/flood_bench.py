"""Ordinary admissions while a tenant floods the webhook with huge pod templates (issue 59, item 8).

Starts the webhook as `serve` runs it (gunicorn over TLS, one worker, eight request threads) on a
leaf-spine cluster, then, round after round: eight reviews of one huge template sent at once, each
on a connection of its own, as many as the server has threads; meanwhile ordinary reviews (the
1 KB GPU Pods and Jobs of bench/admission_bench.py) one after another on a kept-alive connection,
each timed from its send to its answer, until the eight are answered. Before the rounds, the
ordinary reviews alone. The chart gives the apiserver `timeoutSeconds: 5` and `failurePolicy:
Ignore`: an ordinary review slower than that is admitted unplaced.

    .venv/bin/python bench/flood_bench.py                            # 20,000 GPU init containers, 5 rounds
    .venv/bin/python bench/flood_bench.py --shape env --rounds 3     # other lists a template can grow
    ADMISSION_BENCH_TREE=../before .venv/bin/python bench/flood_bench.py   # the webhook of another checkout

Shapes (each about 1.7 MB of review, under the apiserver's 3 MiB body limit, with --count 20000):
gpu-init (the issue's: COUNT init containers asking a GPU each, before an 8-GPU trainer), cpu-init
(the same without GPUs), env (one trainer with COUNT env variables), tolerations, spread (COUNT
topologySpreadConstraints), volumes.
"""
from __future__ import annotations

import argparse
import base64
import http.client
import json
import os
import pathlib
import ssl
import statistics
import sys
import tempfile
import threading
import time
import uuid

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from admission_bench import ROOT, cluster, free_port, machine, review_bodies, serving_files, start  # noqa: E402

FLOOD = 8  # the server's request threads (webhook/serving/server.py THREADS_PER_WORKER)
APISERVER_TIMEOUT_SECONDS = 5.0  # the chart's timeoutSeconds
_UID = "uid-of-this-send"  # a valid label value too


def huge_job(shape: str, count: int) -> dict:
    """A 1-pod Job of one 8-GPU trainer whose template carries `count` items of `shape`."""
    trainer: dict = {"name": "trainer", "image": "trainer", "resources": {"limits": {"nvidia.com/gpu": "8"}}}
    spec: dict = {"restartPolicy": "Never", "containers": [trainer]}
    if shape in ("gpu-init", "cpu-init"):
        limits = {"resources": {"limits": {"nvidia.com/gpu": "1"}}} if shape == "gpu-init" else {}
        spec["initContainers"] = [{"name": f"step-{i}", "image": "busybox", **limits} for i in range(count)]
    elif shape == "env":
        trainer["env"] = [{"name": f"SETTING_{i}", "value": f"value-{i}"} for i in range(count)]
    elif shape == "tolerations":
        spec["tolerations"] = [{"key": f"example.com/t{i}", "operator": "Exists"} for i in range(count)]
    elif shape == "spread":
        spec["topologySpreadConstraints"] = [{"maxSkew": 1, "topologyKey": f"example.com/k{i}",
                                              "whenUnsatisfiable": "ScheduleAnyway"} for i in range(count)]
    elif shape == "volumes":
        spec["volumes"] = [{"name": f"scratch-{i}", "emptyDir": {}} for i in range(count)]
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "huge", "namespace": "tenant",
                         "annotations": {"topology.scheduler/placement-strategy": "consolidated"}},
            "spec": {"parallelism": 1, "completions": 1,
                     "template": {"metadata": {"labels": {"run": _UID}}, "spec": spec}}}


def review_text(obj: dict) -> str:
    """A v1 CREATE review of `obj` as JSON, its uid (and the template's `run` label: no two specs
    alike, so none is checked once for all) a placeholder each send replaces."""
    gvk = {"group": "batch", "version": "v1", "kind": "Job"}
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": _UID, "kind": gvk, "resource": {**gvk, "resource": "jobs"}, "namespace": "tenant",
        "operation": "CREATE", "userInfo": {"username": "tenant"}, "object": obj, "dryRun": False}})


class Server:
    def __init__(self, port: int, ca: str) -> None:
        self.port, self.context = port, ssl.create_default_context(cafile=ca)

    def connect(self) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection("127.0.0.1", self.port, context=self.context, timeout=120)

    @staticmethod
    def send(conn: http.client.HTTPSConnection, body: bytes) -> tuple[float, dict]:
        started = time.perf_counter()
        conn.request("POST", "/mutate?timeout=5s", body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        answer = json.loads(response.read())
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}")
        return time.perf_counter() - started, answer["response"]


def flood_round(server: Server, huge: str, ordinary: list[bytes]) -> tuple[list[tuple[float, dict]], list[float]]:
    """Eight huge reviews at once, ordinary ones meanwhile: (the huge ones' times and answers, the
    ordinary ones' times)."""
    answers: list[tuple[float, dict]] = []
    bodies = [huge.replace(_UID, str(uuid.uuid4())).encode() for _ in range(FLOOD)]

    def send_huge(body: bytes) -> None:
        conn = server.connect()
        try:
            answers.append(server.send(conn, body))
        finally:
            conn.close()

    senders = [threading.Thread(target=send_huge, args=(body,)) for body in bodies]
    for sender in senders:
        sender.start()
    conn, latencies = server.connect(), []
    time.sleep(0.05)  # the eight are on their way: the ordinary ones meet them in the server
    while any(sender.is_alive() for sender in senders) or not latencies:
        latencies.append(server.send(conn, ordinary[len(latencies) % len(ordinary)])[0])
    for sender in senders:
        sender.join()
    conn.close()
    return answers, latencies


def server_durations(log: pathlib.Path, name: str) -> list[float]:
    """duration_ms of the server's log lines for the reviews of `name` (from the body's arrival in
    the request thread to the answer: the time a request thread is taken)."""
    durations = []
    for line in log.read_text().splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and entry.get("name") == name and "duration_ms" in entry:
            durations.append(float(entry["duration_ms"]))
    return durations


def outcome(response: dict) -> str:
    if response.get("allowed"):
        return f"admitted, {len(json.loads(base64.b64decode(response['patch'])))} patch operations" \
            if response.get("patch") else "admitted unchanged"
    return "refused: " + response.get("status", {}).get("message", "")[:110]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=("gpu-init", "cpu-init", "env", "tolerations", "spread", "volumes"),
                        default="gpu-init", help="what the huge template has COUNT of (default: %(default)s)")
    parser.add_argument("--count", type=int, default=20_000, help="(default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=5, help="(default: %(default)s)")
    parser.add_argument("--nodes", type=int, default=1000, help="cluster size (default: %(default)s)")
    args = parser.parse_args()
    huge = review_text(huge_job(args.shape, args.count))
    ordinary = review_bodies(200)
    with tempfile.TemporaryDirectory(prefix="flood-bench-") as tmp:
        workdir = pathlib.Path(tmp)
        nodes, pods = cluster(args.nodes)
        port = free_port()
        command, paths = serving_files(workdir, nodes, pods, port)
        process = start(command, port, paths.ca, workdir / "webhook.log")
        server = Server(port, paths.ca)
        try:
            conn = server.connect()
            alone = [server.send(conn, ordinary[i % len(ordinary)])[0] for i in range(300)][100:]
            conn.close()
            rounds = [flood_round(server, huge, ordinary) for _ in range(args.rounds)]
        finally:
            process.terminate()
            process.wait(timeout=30)
        handled = server_durations(workdir / "webhook.log", "huge")
    print(f"machine: {machine()}; webhook of {ROOT}; {len(nodes)} nodes; load average after: "
          f"{os.getloadavg()[0]:.2f}")
    print(f"huge review: {args.shape} x {args.count}, {len(huge) / 1e6:.2f} MB; answered: "
          f"{outcome(rounds[0][0][0][1])}")
    print(f"server's time per huge review (body decoded and answered, from its log): p50 "
          f"{statistics.median(handled):.1f} ms, max {max(handled):.1f} ms")
    print(f"ordinary reviews alone: p50 {1e3 * statistics.median(alone):.1f} ms, max {1e3 * max(alone):.1f} ms")
    print(f"\n| round | {FLOOD} huge: slowest (s) | ordinary during: n | p50 (ms) | max (ms) | over {APISERVER_TIMEOUT_SECONDS:g} s |")
    print("|---|---|---|---|---|---|")
    for number, (answers, latencies) in enumerate(rounds, 1):
        print(f"| {number} | {max(t for t, _ in answers):.2f} | {len(latencies)} | "
              f"{1e3 * statistics.median(latencies):.1f} | {1e3 * max(latencies):.1f} | "
              f"{sum(t > APISERVER_TIMEOUT_SECONDS for t in latencies)} |")
    worst = max(max(latencies) for _, latencies in rounds)
    print(f"\nslowest ordinary review during a flood: {1e3 * worst:.0f} ms")


if __name__ == "__main__":
    main()
