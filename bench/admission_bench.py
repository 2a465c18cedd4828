"""Admission latency and throughput through gunicorn over TLS, against an empty handler.

Starts two servers with the same gunicorn settings (webhook.serving.server: 1 worker, gthread, TLS):
the webhook with a 10k-node cluster loaded, and an empty Flask handler that only parses the
review and echoes its uid. Each is driven over kept-alive TLS connections, as the apiserver
does, first closed-loop at concurrency 1, 8 and 32 (throughput, p50, p99), then open-loop at a
fixed rate (p99 at 200 reviews/s, measured from each request's scheduled send time so a stall
is not hidden). Client and servers share the machine's cores: figures include that contention.
It also times admission.review() alone in this process on the same cluster and reviews, which
separates the decision path's cost from the server's.

    .venv/bin/python bench/admission_bench.py            # full run (about 2 minutes)
    .venv/bin/python bench/admission_bench.py --quick    # smoke run
    .venv/bin/python bench/admission_bench.py --compare-with ../before   # review() here vs another checkout
    .venv/bin/python bench/admission_bench.py --compare-with ../before --cpu-time   # by CPU time, on a shared machine
    .venv/bin/python bench/admission_bench.py --large    # any of these with production-sized pod specs (11 KB)
    .venv/bin/python bench/admission_bench.py --held 500  # p99 with 500 slow or silent connections open
    .venv/bin/python bench/admission_bench.py --coordination   # claims through the API on vs off
    .venv/bin/python bench/admission_bench.py --coordination --replicas 2   # two replicas sharing them
    .venv/bin/python bench/admission_bench.py --coordination --allotments   # with serve --claims-allotments
    .venv/bin/python bench/admission_bench.py --coordination --allotments --strategies consolidated,balanced   # no spreads
    .venv/bin/python bench/admission_bench.py --coordination --apiserver real   # against kube-apiserver and etcd
    .venv/bin/python bench/admission_bench.py --groups   # group members and controller-made pods vs a plain Pod

--held N starts only the webhook and measures the open loop twice in one run: alone, then with
N connections held open by hostile clients (half complete the TLS handshake and say nothing,
half trickle header bytes that never end, re-opened when the server drops them at its request
deadline); the ratio of the two p99s is what the held connections cost.

--compare-with times admission.review() in process for this checkout and another one (say a
`git worktree` of an earlier commit) in alternating subprocesses on the same cluster and reviews,
and prints the paired ratios: how a change moved the decision path's cost, with the machine's
drift during the run cancelled as far as alternation can, and a 95% bootstrap interval of their
geometric mean, which says whether the rounds can tell the two apart at all.

--coordination starts the local fake API server (tests/integration/fakeapiserver.py) with the cluster loaded
and two webhooks watching it (`serve --kubeconfig`), one sharing claims through the API
(`--claims-namespace`: one Lease write per placed workload) and one not, and drives both with the
same reviews, alternating measurement by measurement, so the ratio is what coordination costs.
With --replicas N, N of each (those with claims share one Lease), each with workloads of its own;
the N of a kind are driven at once, each with the whole load, so off and on meet the same
contention for the cores. With --apiserver real, the same against a real kube-apiserver and etcd
(`hack/local-cluster up --bare`, bench/control_plane.py), the cluster created through its API.
"""
from __future__ import annotations

import argparse
import http.client
import json
import math
import os
import pathlib
import platform
import random
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid

HERE = pathlib.Path(__file__).resolve().parents[1]
TREE_ENV = "ADMISSION_BENCH_TREE"  # --compare-with sets it: the checkout whose webhook package is timed
ROOT = pathlib.Path(os.environ.get(TREE_ENV) or HERE)
sys.path.insert(0, str(ROOT))

from webhook import admission  # noqa: E402
from webhook.credentials import certs
from webhook.kube import demo
from webhook.admission import make_review  # noqa: E402
from webhook.cli import file_index  # noqa: E402
from webhook.objects import feed  # noqa: E402
from webhook.settings.config import Config  # noqa: E402

STRATEGIES = ("consolidated", "balanced", "distributed")
WORKLOAD_NAMES = 500  # reviews cycle over these, so re-placements replace reservations, not pile up
START_TIMEOUT_SECONDS = 180


def cluster(nodes_wanted: int) -> tuple[list[dict], list[dict]]:
    """A leaf-spine cluster of about nodes_wanted 8-GPU nodes, a third of them part-used."""
    spines = max(1, nodes_wanted // 1000)
    nodes = demo.leaf_spine_nodes(spines=spines, leaves=25, nodes=nodes_wanted // (spines * 25))
    pods = [demo.make_pod(f"busy-{i}", node["metadata"]["name"], (i % 4) * 2, namespace="research")
            for i, node in enumerate(nodes) if i % 3 == 0 and i % 4]
    return nodes, pods


def review_bodies(count: int, large: bool = False, prefix: str = "w", strategies: tuple[str, ...] = STRATEGIES
                  ) -> list[bytes]:
    """Serialized v1 reviews: a mix of GPU Pods and Jobs with placement annotations, named
    `prefix` and a number, every strategy of `strategies` on each kind; `large`: each pod spec as
    big as a production training pod's (about 11 KB of review)."""
    bodies = []
    for i in range(count):
        name = f"{prefix}{i % WORKLOAD_NAMES}"
        annotations = {"topology.scheduler/placement-strategy": strategies[(i // 2) % len(strategies)]}
        pod = demo.make_pod(name, None, (1, 2, 4, 8)[i % 4], namespace="ml", annotations=annotations)
        del pod["status"], pod["metadata"]["uid"]
        if large:
            pod["metadata"]["labels"] = {f"team.example.com/label-{j}": "value" for j in range(10)}
            pod["metadata"]["annotations"].update({f"team.example.com/note-{j}": "x" * 40 for j in range(10)})
            pod["spec"] = production_spec(pod["spec"]["containers"][0])
        if i % 2:
            template = {"metadata": {"annotations": {}}, "spec": {**pod["spec"], "restartPolicy": "Never"}}
            obj = {"apiVersion": "batch/v1", "kind": "Job",
                   "metadata": {"name": name, "namespace": "ml", "annotations": annotations},
                   "spec": {"parallelism": 2, "completions": 2, "template": template}}
        else:
            obj = pod
        bodies.append(json.dumps(make_review(obj, uid=str(uuid.uuid4()))).encode())
    return bodies


def production_spec(main: dict) -> dict:
    """A pod spec the size of a production training pod's: `main` (its GPUs) with 41 env entries,
    20 arguments, 12 volumes, ports, probes and a security context, beside a sidecar and an init
    container like it without GPUs."""
    def like_main(name: str, resources: dict) -> dict:
        return {"name": name, "image": main["image"], "command": ["torchrun", "--nproc-per-node=8", "train.py"],
                "args": [f"--option-{j}=value-{j}" for j in range(20)],
                "env": [{"name": f"SETTING_{j}", "value": f"value-{j}"} for j in range(40)]
                + [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
                "resources": resources,
                "volumeMounts": [{"name": f"data-{j}", "mountPath": f"/mnt/data-{j}"} for j in range(12)],
                "ports": [{"containerPort": 29500 + j, "protocol": "TCP", "name": f"port-{j}"} for j in range(4)],
                "readinessProbe": {"httpGet": {"path": "/healthz", "port": 8080}, "periodSeconds": 10},
                "securityContext": {"capabilities": {"add": ["IPC_LOCK", "SYS_RESOURCE"]}}}
    return {"containers": [like_main("main", main["resources"]), like_main("sidecar", {})],
            "initContainers": [like_main("init", {})],
            "volumes": [{"name": f"data-{j}", "persistentVolumeClaim": {"claimName": f"data-{j}"}} for j in range(12)],
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]}


def serving_files(workdir: pathlib.Path, nodes: list[dict], pods: list[dict], port: int
                  ) -> tuple[list[str], certs.CertPaths]:
    """Certificates and the cluster's files written under `workdir`, and the `serve` command on
    them at `port` (its metrics on a port of its own)."""
    paths = certs.write_certs(str(workdir / "tls"), "topology-webhook", "default")
    (workdir / "nodes.json").write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": nodes}))
    (workdir / "pods.json").write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": pods}))
    return [sys.executable, "-m", "webhook", "serve", "--bind", f"127.0.0.1:{port}", "--metrics-bind",
            f"127.0.0.1:{free_port()}", "--cert", paths.cert, "--key", paths.key,
            "--nodes", str(workdir / "nodes.json"), "--pods", str(workdir / "pods.json")], paths


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start(command: list[str], port: int, ca: str, log: pathlib.Path) -> subprocess.Popen:
    # This tree first, then whatever path the bench itself was given (packages installed with --target).
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    with open(log, "wb") as out:
        process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=log.parent)
    context = ssl.create_default_context(cafile=ca)
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{command[:4]} exited:\n{log.read_text()}")
        try:
            conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=5)
            conn.request("GET", "/healthz")
            if conn.getresponse().status == 200:
                return process
        except OSError:
            time.sleep(0.25)
    process.kill()
    raise RuntimeError(f"no /healthz within {START_TIMEOUT_SECONDS} s:\n{log.read_text()}")


class Driver:
    """Sends reviews from threads over kept-alive TLS connections and records latencies."""

    def __init__(self, port: int, ca: str, bodies: list[bytes]) -> None:
        self.port, self.bodies = port, bodies
        self.context = ssl.create_default_context(cafile=ca)
        self._next = 0
        self._lock = threading.Lock()

    def body(self) -> bytes:
        with self._lock:
            self._next += 1
            return self.bodies[self._next % len(self.bodies)]

    def connect(self) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection("127.0.0.1", self.port, context=self.context, timeout=30)

    def send(self, conn: http.client.HTTPSConnection) -> None:
        conn.request("POST", "/mutate?timeout=10s", self.body(), {"Content-Type": "application/json"})
        response = conn.getresponse()
        response.read()
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}")

    def closed_loop(self, concurrency: int, seconds: float) -> dict:
        """Each thread sends its next review as soon as the previous one is answered."""
        latencies: list[float] = []
        deadline = time.perf_counter() + seconds

        def worker():
            conn, mine = self.connect(), []
            while time.perf_counter() < deadline:
                started = time.perf_counter()
                self.send(conn)
                mine.append(time.perf_counter() - started)
            latencies.extend(mine)

        began = time.perf_counter()
        run_threads(worker, concurrency)
        return summary(latencies, time.perf_counter() - began)

    def open_loop(self, rate: float, seconds: float, senders: int = 8) -> dict:
        """Reviews scheduled at a fixed rate; latency counts from the scheduled time."""
        latencies: list[float] = []
        total = int(rate * seconds)
        began = time.perf_counter() + 0.1

        def worker(first: int):
            conn, mine = self.connect(), []
            for k in range(first, total, senders):
                scheduled = began + k / rate
                time.sleep(max(0.0, scheduled - time.perf_counter()))
                self.send(conn)
                mine.append(time.perf_counter() - scheduled)
            latencies.extend(mine)

        run_threads(worker, senders, pass_index=True)
        return summary(latencies, time.perf_counter() - began)


def run_threads(target, count: int, pass_index: bool = False) -> None:
    threads = [threading.Thread(target=target, args=(i,) if pass_index else ()) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def summary(latencies: list[float], elapsed: float) -> dict:
    ordered = sorted(latencies)
    return {"n": len(ordered), "rps": len(ordered) / elapsed,
            "p50_ms": 1000 * statistics.median(ordered), "mean_ms": 1000 * statistics.fmean(ordered),
            "p99_ms": 1000 * ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]}


def in_process(nodes: list[dict], pods: list[dict], bodies: list[bytes], warm_up: int = 0,
               clock=time.perf_counter) -> dict:
    """admission.review() alone on the same cluster and reviews: the decision path without HTTP/TLS.
    The first `warm_up` reviews are not timed; each of the others by `clock`."""
    config = Config()
    index, _ = file_index(config, (nodes, pods))
    reviews = [json.loads(body) for body in bodies]
    for review in reviews[:warm_up]:
        admission.review(review, index, config)
    reviews = reviews[warm_up:]
    latencies = []
    began = time.perf_counter()
    for review in reviews:
        started = clock()
        admission.review(review, index, config)
        latencies.append(clock() - started)
    return summary(latencies, time.perf_counter() - began)


def operator_pod(name: str, job: str, gpus: int = 8) -> dict:
    """A pod as Kubeflow's training operator makes it: labels, owner, the job's annotations."""
    pod = demo.make_pod(name, None, gpus, namespace="ml", annotations={
        "topology.scheduler/gpu-count": str(4 * gpus), "topology.scheduler/placement-strategy": "consolidated"})
    del pod["status"], pod["metadata"]["uid"]
    pod["metadata"]["labels"] = {"training.kubeflow.org/job-name": job}
    pod["metadata"]["ownerReferences"] = [{"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": job,
                                           "uid": f"uid-{job}", "controller": True}]
    return pod


def groups(nodes_wanted: int, count: int) -> None:
    """admission.review() in process for four kinds of review, interleaved on one cluster: a plain
    GPU Pod (decides alone), the first pod of a 4-pod group (decides for the group), a pod joining
    a group (the decision is looked up), and a pod its Job controller made from a template we
    placed (checked for repair, then left alone)."""
    config = Config()
    nodes, pods = cluster(nodes_wanted)
    index, _ = file_index(config, (nodes, pods))
    job = admission.review(make_review(demo_job()), index, config).admitted
    # A 500-pod Job pinned across a dozen leaves, 400 of its pods bound there: every pod its
    # controller makes is checked against that whole domain and the workload's own pods.
    large = admission.review(make_review(demo_job(500, "large-job")), index, config).admitted
    taken = {pod["spec"]["nodeName"] for pod in pods}
    open_nodes = [n["metadata"]["name"] for n in nodes if n["metadata"]["name"] not in taken
                  and pinned_to(n, large["spec"]["template"])]
    for i, node in enumerate(open_nodes[:400]):
        feed.upsert(index, {**job_pod(large, f"large-job-{i}"), "spec": {**large["spec"]["template"]["spec"], "nodeName": node},
                            "status": {"phase": "Running"}}, "Pod")
    timings: dict[str, list[float]] = {"plain Pod": [], "group: first member": [], "group: joining member": [],
                                       "Job's pod (repair check)": [], "500-pod Job's pod, 400 bound (repair check)": []}
    for i in range(count):
        name = f"g{i % WORKLOAD_NAMES}"
        plain = demo.make_pod(f"p{i % WORKLOAD_NAMES}", None, 8, namespace="ml",
                              annotations={"topology.scheduler/placement-strategy": "consolidated"})
        del plain["status"], plain["metadata"]["uid"]
        child = job_pod(job, f"{job['metadata']['name']}-{i}")
        index.release(f"ml/PyTorchJob/{name}")  # the group's earlier round ends: its pods decide afresh
        getattr(index.ledger, "groups", {}).pop(f"ml/PyTorchJob/{name}", None)  # (absent before groups)
        members = [operator_pod(f"{name}-{m}", name) for m in range(4)]
        for label, obj in [("plain Pod", plain), ("group: first member", members[0]),
                           *[("group: joining member", member) for member in members[1:]],
                           ("Job's pod (repair check)", child),
                           ("500-pod Job's pod, 400 bound (repair check)", job_pod(large, f"large-job-{400 + i}"))]:
            review = make_review(obj, uid=str(uuid.uuid4()))
            started = time.perf_counter()
            admission.review(review, index, config)
            timings[label].append(time.perf_counter() - started)
    print(f"machine: {machine()}; {len(nodes)} nodes; {count} rounds; load average {os.getloadavg()[0]:.2f}")
    print("\n| review | p50 ms | p99 ms | p50 / plain Pod |\n|---|---|---|---|")
    plain_p50 = statistics.median(timings["plain Pod"])
    for label, values in timings.items():
        ordered = sorted(values)
        p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
        print(f"| {label} | {statistics.median(values) * 1e3:.3f} | {p99 * 1e3:.3f} | "
              f"{statistics.median(values) / plain_p50:.2f} |")


def demo_job(pods: int = 2, name: str = "bench-job") -> dict:
    """A `pods` x 8 GPU consolidated Job, placed first; its controller-made pods are timed."""
    template = {"metadata": {"annotations": {"topology.scheduler/placement-strategy": "consolidated"}},
                "spec": {"restartPolicy": "Never", "containers": [
                    {"name": "main", "image": "trainer", "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": "ml"},
            "spec": {"parallelism": pods, "completions": pods, "template": template}}


def pinned_to(node: dict, template: dict) -> bool:
    """Whether `node` matches every `In` expression of a term of the template's required node affinity."""
    affinity = template["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    labels = node["metadata"]["labels"]
    return any(all(labels.get(e["key"]) in e["values"] for e in term["matchExpressions"] if e["operator"] == "In")
               for term in affinity["nodeSelectorTerms"])


def job_pod(job: dict, name: str) -> dict:
    """A pod as the Job controller makes it from the placed template."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {**job["spec"]["template"]["metadata"], "name": name, "namespace": "ml",
                         "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": job["metadata"]["name"],
                                              "uid": "u", "controller": True}]},
            "spec": job["spec"]["template"]["spec"]}


def compare(other: pathlib.Path, nodes: int, rounds: int, large: bool, cpu_time: bool = False) -> None:
    """admission.review() of this checkout against `other`'s, alternating, one subprocess each."""
    def timed(tree: pathlib.Path, seed: int) -> dict:
        # The two trees of a round share a hash seed: set and dict orders of strings (hence some
        # paths' lengths) then differ between rounds, not between the trees compared.
        flags = [*(["--large"] if large else []), *(["--cpu-time"] if cpu_time else [])]
        output = subprocess.run([sys.executable, __file__, "--in-process", "--nodes", str(nodes), *flags],
                                check=True, capture_output=True, text=True, env={**os.environ, TREE_ENV: str(tree), "PYTHONHASHSEED": str(seed)}).stdout
        return json.loads(output.splitlines()[-1])

    print(f"machine: {machine()}; load average before: {os.getloadavg()[0]:.2f}; {nodes} nodes, {rounds} rounds")
    print(f"\n| round | {other} p50 ms | p99 ms | {HERE} p50 ms | p99 ms | p50 ratio | p99 ratio | mean ratio |")
    print("|---|---|---|---|---|---|---|---|")
    ratios, tails = [], []
    for round_number in range(1, rounds + 1):
        before, after = timed(other, round_number), timed(HERE, round_number)
        ratios.append(after["mean_ms"] / before["mean_ms"])
        tails.append(after["p99_ms"] / before["p99_ms"])
        print(f"| {round_number} | {before['p50_ms']:.2f} | {before['p99_ms']:.2f} | {after['p50_ms']:.2f} | "
              f"{after['p99_ms']:.2f} | {after['p50_ms'] / before['p50_ms']:.2f} | {tails[-1]:.2f} | {ratios[-1]:.2f} |")
    print(f"\nmedian mean-time ratio (this checkout / other): {statistics.median(ratios):.2f}; median p99 ratio: "
          f"{statistics.median(tails):.2f}; load average after: {os.getloadavg()[0]:.2f}")
    # The rounds as paired observations (bench/protocol.py's bootstrap over their log ratios): on a
    # noisy machine a median of a few rounds moves by several percent with nothing changed.
    from protocol import compare as paired  # bench/, this script's directory
    logs = paired([math.log(r) for r in ratios], [0.0] * len(ratios), random.Random(0))
    reading = {"ahead": "faster", "behind": "slower"}.get(logs.verdict, "no difference these rounds can tell")
    print(f"geometric mean of the rounds' ratios: {math.exp(logs.mean):.3f}, 95% bootstrap interval "
          f"[{math.exp(logs.low):.3f}, {math.exp(logs.high):.3f}]: {reading}")


def fake_api_server(nodes_wanted: int, pipe) -> None:
    """The fake API server with the cluster loaded, in a process of its own (not competing with
    the driver's threads for one interpreter): sends its URL, then on each message the count of
    Lease writes and of those answered 409; None stops it."""
    from tests.integration.fakeapiserver import FakeApiServer

    api = FakeApiServer(bookmark_interval=5.0).start()
    nodes, pods = cluster(nodes_wanted)
    for obj in nodes:
        api.put_node(obj)
    for obj in pods:
        api.put_pod(obj)
    pipe.send(api.url)
    while pipe.recv() is not None:
        pipe.send((len(api.writes), sum(code == 409 for *_, code in api.writes)))
    api.stop()


class FakeControlPlane:
    """`fake_api_server` behind the interface of control_plane.RealControlPlane."""

    def __init__(self, workdir: pathlib.Path, nodes_wanted: int) -> None:
        import multiprocessing

        self.workdir = workdir
        self.pipe, theirs = multiprocessing.Pipe()
        self.process = multiprocessing.Process(target=fake_api_server, args=(nodes_wanted, theirs), daemon=True)

    def start(self) -> str:
        self.process.start()
        url = self.pipe.recv()
        kubeconfig = self.workdir / "kubeconfig"
        kubeconfig.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "bench",
            "clusters": [{"name": "fake", "cluster": {"server": url}}], "users": [{"name": "me", "user": {}}],
            "contexts": [{"name": "bench", "context": {"cluster": "fake", "user": "me"}}]}))
        return str(kubeconfig)

    def load(self, nodes: list[dict], pods: list[dict], namespaces: list[str]) -> None:
        pass  # loaded in its own process, which makes the same cluster

    def lease_writes(self) -> tuple[int, int]:
        self.pipe.send("count")
        return self.pipe.recv()

    def stop(self) -> None:
        if self.process.is_alive():
            self.pipe.send(None)
            self.process.join(timeout=30)


def coordination(args: argparse.Namespace) -> None:
    """Admission latency with claims shared through the API, next to the same live view without."""
    nodes, pods = cluster(args.nodes)
    # Each replica its own workloads, as the apiserver sends one object's review to one replica.
    bodies = [review_bodies(4000, args.large, prefix="w" if r == 0 else f"r{r}-w", strategies=args.strategies)
              for r in range(args.replicas)]
    with tempfile.TemporaryDirectory(prefix="admission-bench-") as tmp:
        workdir = pathlib.Path(tmp)
        paths = certs.write_certs(str(workdir / "tls"), "topology-webhook", "default")
        if args.apiserver == "real":
            from bench.control_plane import RealControlPlane
            plane: "FakeControlPlane | RealControlPlane" = RealControlPlane(workdir / "control-plane")
        else:
            plane = FakeControlPlane(workdir, args.nodes)
        drivers: dict[str, list[Driver]] = {"off": [], "on": []}
        processes = []
        try:
            kubeconfig = plane.start()
            plane.load(nodes, pods, ["research", "ml", "bench"])
            settings = []
            if args.hold_seconds:
                (workdir / "settings.yaml").write_text(f"reservation_ttl_seconds: {args.hold_seconds}\n")
                settings = ["--config", str(workdir / "settings.yaml")]
            on = ["--claims-namespace", "bench", *(["--claims-allotments"] if args.allotments else [])]
            for label, extra in (("off", settings), ("on", settings + on)):
                for replica in range(args.replicas):
                    port = free_port()  # each its own metrics port too: the default 9090 takes one process
                    processes.append(start([sys.executable, "-m", "webhook", "serve", "--bind", f"127.0.0.1:{port}",
                                            "--metrics-bind", f"127.0.0.1:{free_port()}", "--cert", paths.cert,
                                            "--key", paths.key, "--kubeconfig", kubeconfig, *extra],
                                           port, paths.ca, workdir / f"{label}-{replica}.log"))
                    drivers[label].append(Driver(port, paths.ca, bodies[replica]))
            for driver in drivers["off"] + drivers["on"]:
                wait_ready(driver)
                driver.closed_loop(4, min(2.0, args.seconds))  # warm-up
            print(f"machine: {machine()}; load average before: {os.getloadavg()[0]:.2f}")
            served_by = ("a real kube-apiserver and etcd (hack/local-cluster up --bare)" if args.apiserver == "real"
                         else "the fake API server")
            print(f"cluster: {len(nodes)} nodes, {len(pods)} running pods, served by {served_by}; "
                  f"{args.seconds:g} s per measurement, off and on alternating; {args.replicas} replica(s) "
                  "of each, driven at once, each with the load")
            writes_before, conflicts_before = plane.lease_writes()
            results: dict[str, dict] = {}
            for load in ("c=1", "c=8", f"{args.rate:g}/s"):
                for label, group in drivers.items():
                    def measure(replica: int, load: str = load, group: list[Driver] = group, label: str = label) -> None:
                        driver = group[replica]
                        results[f"{label} {load} {replica}"] = (
                            driver.open_loop(args.rate, args.seconds) if load.endswith("/s")
                            else driver.closed_loop(int(load[2:]), args.seconds))
                    run_threads(measure, args.replicas, pass_index=True)
            writes, conflicts = plane.lease_writes()
        finally:
            for process in processes:
                process.terminate()
                process.wait(timeout=30)
            plane.stop()
    print("\n| load | off p50 ms | off p99 ms | off reviews/s | on p50 ms | on p99 ms | on reviews/s "
          "| p50 ratio | p99 ratio |")
    print("|---|---|---|---|---|---|---|---|---|")
    for load, replica in ((load, r) for load in ("c=1", "c=8", f"{args.rate:g}/s") for r in range(args.replicas)):
        off, on = results[f"off {load} {replica}"], results[f"on {load} {replica}"]
        named = f"{load}, replica {replica + 1}" if args.replicas > 1 else load
        print(f"| {named} | {off['p50_ms']:.2f} | {off['p99_ms']:.2f} | {off['rps']:.0f} | {on['p50_ms']:.2f} | "
              f"{on['p99_ms']:.2f} | {on['rps']:.0f} | {on['p50_ms'] / off['p50_ms']:.2f} | "
              f"{on['p99_ms'] / off['p99_ms']:.2f} |")
    print(f"\nLease writes: {writes - writes_before} ({conflicts - conflicts_before} answered 409); "
          f"load average after: {os.getloadavg()[0]:.2f}")


def wait_ready(driver: Driver) -> None:
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        conn = driver.connect()
        conn.request("GET", "/readyz")
        if conn.getresponse().status == 200:
            return
        time.sleep(0.25)
    raise RuntimeError(f"no /readyz within {START_TIMEOUT_SECONDS} s")


def serve_empty(bind: str, cert: str, key: str) -> None:
    """The baseline: gunicorn with our settings around a handler that parses the review and
    answers allowed, with no placement and no metrics."""
    from flask import Flask, Response, request

    from webhook.serving.server import ServeOptions, WebhookServer

    def build_app():
        app = Flask("empty")

        @app.post("/mutate")
        def mutate():
            review = json.loads(request.get_data())
            answer = {"apiVersion": review["apiVersion"], "kind": "AdmissionReview",
                      "response": {"uid": review["request"]["uid"], "allowed": True}}
            return Response(json.dumps(answer), mimetype="application/json")

        @app.get("/healthz")
        def healthz():
            return "ok"

        return app

    WebhookServer(build_app, ServeOptions(bind=bind, cert=cert, key=key)).run()


class HeldConnections:
    """`count` connections that hold on without ever completing a request (see --held)."""

    def __init__(self, port: int, ca: str, count: int) -> None:
        self.port, self.count = port, count
        self.context = ssl.create_default_context(cafile=ca)
        self.stop = threading.Event()
        self.open: list[ssl.SSLSocket] = []
        self.thread = threading.Thread(target=self._hold)

    def _connect(self, trickle: bool) -> ssl.SSLSocket:
        raw = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        conn = self.context.wrap_socket(raw, server_hostname="localhost")
        if trickle:
            conn.sendall(b"POST /mutate HTTP/1.1\r\nHost: localhost\r\n")
        conn.trickle = trickle
        return conn

    def _hold(self) -> None:
        while not self.stop.wait(0.2):  # bounded by the measurement: stop is set when it ends
            for position, conn in enumerate(self.open):
                try:
                    if conn.trickle:
                        conn.sendall(b"x")
                except OSError:  # dropped at the server's deadline: hold another one
                    conn.close()
                    self.open[position] = self._connect(conn.trickle)

    def __enter__(self) -> "HeldConnections":
        self.open = [self._connect(trickle=i % 2 == 1) for i in range(self.count)]
        self.thread.start()
        return self

    def __exit__(self, *_exc) -> None:
        self.stop.set()
        self.thread.join(timeout=30)
        for conn in self.open:
            conn.close()


def held_connections(args: argparse.Namespace, workdir: pathlib.Path, paths, bodies: list[bytes],
                     command: list[str], port: int) -> None:
    """--held: the open loop alone, then with args.held connections held; one table row."""
    process = start(command, port, paths.ca, workdir / "webhook.log")
    try:
        driver = Driver(port, paths.ca, bodies)
        driver.closed_loop(4, min(2.0, args.seconds))  # warm-up
        alone = driver.open_loop(args.rate, args.seconds)
        with HeldConnections(port, paths.ca, args.held):
            held = driver.open_loop(args.rate, args.seconds)
    finally:
        process.terminate()
        process.wait(timeout=30)
    print(f"\n| load | alone p50 ms | alone p99 ms | with {args.held} held p50 ms | with {args.held} held p99 ms "
          "| p99 ratio |")
    print("|---|---|---|---|---|---|")
    print(f"| {args.rate:g}/s | {alone['p50_ms']:.2f} | {alone['p99_ms']:.2f} | {held['p50_ms']:.2f} | "
          f"{held['p99_ms']:.2f} | {held['p99_ms'] / alone['p99_ms']:.2f} |")


def machine() -> str:
    model = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
                 platform.processor())
    usable = len(os.sched_getaffinity(0))  # fewer than the machine's under taskset
    cpus = f"{usable} of {os.cpu_count()} CPUs" if usable != os.cpu_count() else f"{usable} CPUs"
    return f"{cpus} ({model}), Python {platform.python_version()}, {platform.system()} {platform.release()}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=10_000, help="cluster size (default: %(default)s)")
    parser.add_argument("--seconds", type=float, default=10.0, help="per measurement (default: %(default)s)")
    parser.add_argument("--rate", type=float, default=200.0, help="open-loop rate, reviews/s (default: %(default)s)")
    parser.add_argument("--quick", action="store_true", help="1,000 nodes and 2 s per measurement")
    parser.add_argument("--compare-with", type=pathlib.Path, metavar="CHECKOUT",
                        help="time admission.review() here and in CHECKOUT, alternating; no servers")
    parser.add_argument("--rounds", type=int, default=5, help="with --compare-with (default: %(default)s)")
    parser.add_argument("--held", type=int, metavar="N", help="p99 alone and with N slow or silent connections held")
    parser.add_argument("--coordination", action="store_true",
                        help="live view with claims shared through the API, next to the same without")
    parser.add_argument("--allotments", action="store_true",
                        help="with --coordination: the webhooks with claims claim allotments (serve --claims-allotments)")
    parser.add_argument("--strategies", type=lambda text: tuple(text.split(",")), default=STRATEGIES,
                        help="with --coordination: the placement strategies of the reviews, comma-separated "
                             "(default: %(default)s)")
    parser.add_argument("--replicas", type=int, default=1,
                        help="with --coordination: replicas of each, sharing the claims (default: %(default)s)")
    parser.add_argument("--hold-seconds", type=float, metavar="S",
                        help="with --coordination: the webhooks' reservation_ttl_seconds (theirs: 300). No pod of "
                             "the bench's is ever created, so its claims leave the Lease only when they lapse; "
                             "S stands for pods created and bound S seconds after their admission")
    parser.add_argument("--apiserver", choices=("fake", "real"), default="fake",
                        help="with --coordination: the fake API server, or a real kube-apiserver and etcd "
                             "(hack/local-cluster up --bare, its binary built once)")
    parser.add_argument("--serve-empty", nargs=3, metavar=("BIND", "CERT", "KEY"), help=argparse.SUPPRESS)
    parser.add_argument("--groups", action="store_true",
                        help="group members and controller-made pods against a plain Pod, in process")
    parser.add_argument("--in-process", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--cpu-time", action="store_true",
                        help="with --compare-with: time each review by its thread's CPU time, not the wall clock "
                             "(on a machine others share, their processes then do not count)")
    parser.add_argument("--large", action="store_true",
                        help="reviews of production-sized pod specs (about 11 KB each) instead of about 1 KB")
    args = parser.parse_args()
    if args.serve_empty:
        serve_empty(*args.serve_empty)
        return
    if args.in_process:  # one side of --compare-with: a JSON line of admission.review() timings
        nodes, pods = cluster(args.nodes)
        clock = time.thread_time if args.cpu_time else time.perf_counter
        print(json.dumps(in_process(nodes, pods, review_bodies(3500, args.large), warm_up=500, clock=clock)))
        return
    if args.compare_with:
        compare(args.compare_with.resolve(), args.nodes, args.rounds, args.large, args.cpu_time)
        return
    if args.quick:
        args.nodes, args.seconds = 1000, 2.0
    if args.coordination:
        coordination(args)
        return
    if args.groups:
        groups(args.nodes, 300 if args.quick else 2000)
        return

    with tempfile.TemporaryDirectory(prefix="admission-bench-") as tmp:
        workdir = pathlib.Path(tmp)
        nodes, pods = cluster(args.nodes)
        bodies = review_bodies(4000, args.large)
        ours_port, empty_port = free_port(), free_port()
        ours, paths = serving_files(workdir, nodes, pods, ours_port)
        servers = {
            "webhook": (ours_port, ours),
            "empty": (empty_port, [sys.executable, __file__, "--serve-empty", f"127.0.0.1:{empty_port}",
                                   paths.cert, paths.key]),
        }
        print(f"machine: {machine()}; load average before: {os.getloadavg()[0]:.2f}")
        print(f"cluster: {len(nodes)} nodes, {8 * len(nodes)} GPUs, {len(pods)} running pods; "
              f"{args.seconds:g} s per measurement")
        if args.held:
            held_connections(args, workdir, paths, bodies, servers["webhook"][1], ours_port)
            return
        alone = in_process(nodes, pods, bodies)
        print(f"admission.review() in process, no HTTP: p50 {alone['p50_ms']:.2f} ms, p99 {alone['p99_ms']:.2f} ms, "
              f"{alone['rps']:.0f} reviews/s on one core")
        results: dict[str, dict] = {}
        for label, (port, command) in servers.items():
            process = start(command, port, paths.ca, workdir / f"{label}.log")
            try:
                driver = Driver(port, paths.ca, bodies)
                driver.closed_loop(4, min(2.0, args.seconds))  # warm-up
                for concurrency in (1, 8, 32):
                    results[f"{label} c={concurrency}"] = driver.closed_loop(concurrency, args.seconds)
                results[f"{label} {args.rate:g}/s"] = driver.open_loop(args.rate, args.seconds)
            finally:
                process.terminate()
                process.wait(timeout=30)

        print("\n| load | webhook p50 ms | webhook p99 ms | webhook reviews/s | empty p50 ms | empty p99 ms "
              "| empty reviews/s | p50 ratio | p99 ratio |")
        print("|---|---|---|---|---|---|---|---|---|")
        for load in ("c=1", "c=8", "c=32", f"{args.rate:g}/s"):
            ours, empty = results[f"webhook {load}"], results[f"empty {load}"]
            print(f"| {load} | {ours['p50_ms']:.2f} | {ours['p99_ms']:.2f} | {ours['rps']:.0f} | "
                  f"{empty['p50_ms']:.2f} | {empty['p99_ms']:.2f} | {empty['rps']:.0f} | "
                  f"{ours['p50_ms'] / empty['p50_ms']:.2f} | {ours['p99_ms'] / empty['p99_ms']:.2f} |")
        after = os.getloadavg()[0]
        shared = " (above the CPU count, other processes shared the cores)" if after > len(os.sched_getaffinity(0)) else ""
        print(f"\nload average after: {after:.2f}{shared}")


if __name__ == "__main__":
    main()
