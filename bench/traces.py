"""Job streams: synthetic ones sampled from published trace distributions, and a loader for real traces.

Two stream versions (`STREAM_VERSIONS`; `sample_stream(..., version=...)`):

- **2, the default since issue 38 (item 4)**: sizes and durations drawn jointly. Each job's size
  bucket is drawn from the trace's job-count shares, and its duration from a lognormal whose median
  depends on the bucket: the per-bucket medians are proportional to GPU-time share / (job-count
  share x bucket size), so that the stream reproduces the trace's GPU-time share per bucket, and one
  scale and one sigma per trace are fitted so that the mixture's p50 and p90 are the trace's
  (`joint_durations`). Larger jobs run longer, as the traces report: at acme_seren the median of a
  256-GPU job is about 24 times a 1-GPU job's, at philly an 8-GPU job's about 4.5 times; helios_all
  rises to 17-32 GPUs and falls above 64 (the trace's GPU-time table says so, from counts of 0.1-0.4%).
  No cap: none of these traces reports one, and the fitted tails stay at or below the trace's p99
  except at acme_kalos (below). Each job carries its own communication share, log-uniform between
  `SHARE_LOW` and `SHARE_HIGH` (median 0.1, the share every job had before; no trace records it:
  Tiresias found most models insensitive to consolidation and a few, VGG-like, sensitive, so the
  distribution is skewed toward small shares, an estimate). A job above 8 GPUs goes as pods of 4
  GPUs with probability `FOUR_GPU_PODS` (an estimate: Helios and Acme record node_num, but their
  job CSVs are not shippable and no published table gives GPUs per node of multi-node jobs), else
  as pods of 8, one per node. Every draw is made from `random.random()` alone (inverse CDFs), so a
  seed draws the same stream under every CPython since 3.2, unlike version 1.
- **1, the streams of every run before issue 38** (`--streams 1`), drawn exactly as then: size drawn
  independently of duration, durations lognormal with the trace's median and sigma redrawn above
  min(p99, cap_s) (3 h in the full grid), every multi-node job whole 8-GPU pods, every job the
  scenario's one communication share. tests/simulator/test_bench_quality.py pins these streams for a few seeds.

Sources: size shares by job count and by share of GPU time, per bucket, read from the vector paths of
the published CDF figures (about +-0.3 points; checked against the mean GPUs per job of AcmeTrace
data/cluster_summary.csv)
(https://github.com/InternLM/AcmeTrace figure/cdf_job_gpunum.pdf for Philly, Helios and Acme;
https://github.com/S-Lab-System-Group/HeliosArtifact for the Helios clusters); duration p50, p90 and
p99 from AcmeTrace figure/cdf_job_duration_util.pdf and data/cluster_summary.csv, lognormal sigmas
(version 1) fitted from p50/p90. Each size bucket is drawn as one representative size (3-4 is
"mostly 4" and 5-8 "mostly 8"; wider buckets take their power of two, >128 taken as 256), also in
the GPU-time ratio above. A GPU-time share printed as 0.0 with a nonzero count (acme_kalos 2 and
9-16 GPUs) is taken as 0.025%, half the table's last digit (an estimate).

How version 2 compares with the traces' own figures (mean run from cluster_summary.csv; p99 from
the figure): philly mean 11,700 s against 18,006, p99 174,000 s against about 410,000; helios_all
9,400 against 6,652, p99 127,000 against 150,000; acme_seren 740 against 1,414, p99 9,600 against
28,000; acme_kalos 1,300 against 1,260, p99 19,600 against 14,000. So the fitted tails are lighter
than the traces' at philly and acme_seren: long jobs are if anything fewer than in the traces.
"""
from __future__ import annotations

import bisect
import csv
import functools
import math
import random
from dataclasses import dataclass
from statistics import NormalDist

from .fabric import GPUS_PER_NODE

# trace: (job-count % per bucket g1, g2, g3_4, g5_8, g9_16, g17_32, g33_64, g65_128, g129p)
SIZE_SHARES = {
    "philly": (82.4, 2.1, 7.6, 6.9, 0.9, 0.2, 0.0, 0.0, 0.0),
    "helios_all": (72.2, 2.6, 5.7, 14.2, 3.0, 1.6, 0.4, 0.2, 0.1),
    "acme_seren": (54.0, 11.4, 2.5, 28.8, 1.1, 1.0, 0.5, 0.2, 0.4),
    "acme_kalos": (86.3, 2.1, 0.0, 5.6, 0.3, 0.4, 0.7, 0.4, 4.3),
}
BUCKET_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
# trace: (median run s, lognormal sigma, p99 run s) of GPU jobs (sources in the module docstring).
DURATIONS = {
    "philly": (853.0, 2.28, 4.1e5),
    "helios_all": (201.0, 2.77, 1.5e5),
    "acme_seren": (134.0, 1.80, 2.8e4),
    "acme_kalos": (125.0, 1.96, 1.4e4),
}

# trace: (GPU-time % per bucket, same buckets as SIZE_SHARES), from the same figures as SIZE_SHARES.
GPU_TIME_SHARES = {
    "philly": (16.4, 3.0, 18.8, 49.9, 9.2, 2.8, 0.0, 0.0, 0.0),
    "helios_all": (5.4, 1.7, 5.0, 29.2, 20.2, 25.1, 7.7, 3.1, 2.5),
    "acme_seren": (1.3, 0.4, 0.6, 9.6, 1.2, 6.0, 8.5, 14.1, 58.3),
    "acme_kalos": (0.2, 0.0, 0.0, 0.5, 0.0, 1.3, 1.3, 0.5, 96.3),
}
GPU_TIME_FLOOR = 0.025  # % taken for a share printed 0.0 whose bucket has jobs (half the last digit)
# trace: (p50, p90 run s) of GPU jobs, AcmeTrace figure/cdf_job_duration_util.pdf panel (a); version 2 fits them.
DURATION_PERCENTILES = {
    "philly": (853.0, 15822.0),
    "helios_all": (201.0, 6969.0),
    "acme_seren": (134.0, 1352.0),
    "acme_kalos": (125.0, 1546.0),
}
STREAM_VERSIONS = (1, 2)
STREAMS = 2  # the version new runs draw
SHARE_LOW, SHARE_HIGH = 0.02, 0.5  # each job's communication share, log-uniform (version 2)
SHARE_MEDIAN = math.sqrt(SHARE_LOW * SHARE_HIGH)  # 0.1, the one share of version 1's main grid
FOUR_GPU_PODS = 0.25  # share of jobs above 8 GPUs that go as pods of 4 GPUs (version 2; an estimate)

CSV_REQUIRED = ("job_id", "submit_s", "duration_s", "num_gpus")
CSV_OPTIONAL = ("gpu_milli", "gpu_type", "workers", "source_nodes", "comm_bytes_per_iter")


class TraceError(ValueError):
    """A trace file is unusable; the message names the file, the row and column, and what is allowed."""


@dataclass(frozen=True)
class Job:
    job_id: str
    submit_s: float
    duration_s: float  # run time at the tightest placement (traces are placement-blind)
    pods: int
    gpus_per_pod: int
    # share of its run time in all-reduce at the tightest placement; None: the scenario's one share
    # (version 1 streams and replayed traces)
    comm_share: float | None = None

    @property
    def gpus(self) -> int:
        return self.pods * self.gpus_per_pod


def shape(gpus: int, workers: int | None = None) -> tuple[int, int]:
    """(pods, GPUs per pod): up to 8 GPUs is one pod, more is pods of 8 (one per node), unless the
    trace says how many workers the job had."""
    if workers and gpus % workers == 0 and gpus // workers <= GPUS_PER_NODE:
        return workers, gpus // workers
    if gpus <= GPUS_PER_NODE:
        return 1, gpus
    return math.ceil(gpus / GPUS_PER_NODE), GPUS_PER_NODE


def sample_stream(trace: str, load: float, cluster_gpus: int, horizon_s: float, cap_s: float,
                  seed: int, version: int = STREAMS) -> list[Job]:
    """Poisson arrivals over `horizon_s` whose offered load (GPU-seconds asked per second / GPUs) is
    `load`, drawn as stream `version` says (the module docstring); `cap_s` bounds version 1's
    durations only."""
    if trace not in SIZE_SHARES:
        raise ValueError(f"trace {trace!r} is not one of {', '.join(SIZE_SHARES)}")
    if version == 1:
        return _sample_stream_v1(trace, load, cluster_gpus, horizon_s, cap_s, seed)
    if version == 2:
        return _sample_stream_v2(trace, load, cluster_gpus, horizon_s, seed)
    raise ValueError(f"stream version {version!r} is not one of {', '.join(map(str, STREAM_VERSIONS))}")


@functools.cache
def joint_durations(trace: str) -> tuple[tuple[float, ...], float]:
    """(median run s per size bucket, lognormal sigma) of version 2: medians proportional to GPU-time
    share / (job-count share x bucket size), scaled, and sigma chosen, so that the mixture over the
    buckets (weighted by job count) has the trace's p50 and p90. 0 for a bucket without jobs."""
    counts, times = SIZE_SHARES[trace], GPU_TIME_SHARES[trace]
    total = sum(counts)
    weights = [c / total for c in counts]
    relative = [max(t, GPU_TIME_FLOOR) / (c * size) if c > 0 else 0.0
                for c, t, size in zip(counts, times, BUCKET_SIZES)]
    p50, p90 = DURATION_PERCENTILES[trace]
    normal = NormalDist()

    def quantile(q: float, scale: float, sigma: float) -> float:
        def cdf(x: float) -> float:
            return sum(w * normal.cdf((math.log(x) - math.log(scale * r)) / sigma)
                       for w, r in zip(weights, relative) if w > 0)
        low, high = 1e-3, 1e12
        for _ in range(200):
            middle = math.sqrt(low * high)
            low, high = (middle, high) if cdf(middle) < q else (low, middle)
        return high

    low, high = 0.05, 5.0  # the mixture's p90 / p50 grows with sigma
    for _ in range(60):
        sigma = (low + high) / 2
        scale = p50 / quantile(0.5, 1.0, sigma)  # the median scales with the medians
        low, high = (sigma, high) if quantile(0.9, scale, sigma) < p90 else (low, sigma)
    sigma = (low + high) / 2
    scale = p50 / quantile(0.5, 1.0, sigma)
    return tuple(round(scale * r, 6) for r in relative), round(sigma, 6)


def _sample_stream_v2(trace: str, load: float, cluster_gpus: int, horizon_s: float, seed: int) -> list[Job]:
    """Version 2 (the module docstring). Each job takes exactly five draws of `random()`: the gap
    before it, its size, its pods' shape, its duration and its communication share."""
    medians, sigma = joint_durations(trace)
    counts = SIZE_SHARES[trace]
    cumulative = [sum(counts[:i + 1]) / sum(counts) for i in range(len(counts))]
    normal = NormalDist()

    def work_in_horizon(median: float) -> float:
        """E[min(D, horizon_s)] of a lognormal D: the run time a job can ask inside the horizon."""
        mu, tail = math.log(median), math.log(horizon_s)
        return (median * math.exp(sigma * sigma / 2) * normal.cdf((tail - mu - sigma * sigma) / sigma)
                + horizon_s * (1 - normal.cdf((tail - mu) / sigma)))

    # The arrival rate, exact: the load counts each job's run up to the horizon's length. The runs
    # are not cut there; but with these tails (mean over median e^(sigma^2/2), 5 to 37) the untruncated
    # mean would be carried by the few jobs of days, and a 9 h stream would offer a third of its load.
    mean_work = sum(c / sum(counts) * min(size, cluster_gpus) * work_in_horizon(median)
                    for c, size, median in zip(counts, BUCKET_SIZES, medians) if c > 0)
    rate = load * cluster_gpus / mean_work
    rng = random.Random(f"stream-v2-{trace}-{seed}")

    def unit() -> float:
        """A draw strictly inside (0, 1)."""
        value = rng.random()
        return value if value > 0.0 else 0.5

    out: list[Job] = []
    now = -math.log(unit()) / rate
    while now < horizon_s:
        bucket = min(bisect.bisect_left(cumulative, unit()), len(counts) - 1)
        while counts[bucket] == 0:  # float round-off at an edge: the next bucket with jobs
            bucket -= 1
        size = min(BUCKET_SIZES[bucket], cluster_gpus)
        four = unit() < FOUR_GPU_PODS
        if size > GPUS_PER_NODE and four and size % 4 == 0:
            pods, per_pod = size // 4, 4
        else:
            pods, per_pod = shape(size)
        duration = max(1.0, medians[bucket] * math.exp(sigma * normal.inv_cdf(unit())))
        share = SHARE_LOW * (SHARE_HIGH / SHARE_LOW) ** unit()
        out.append(Job(f"{trace}-{len(out)}", now, duration, pods, per_pod, share))
        now += -math.log(unit()) / rate
    return out


def _sample_stream_v1(trace: str, load: float, cluster_gpus: int, horizon_s: float, cap_s: float,
                      seed: int) -> list[Job]:
    """Version 1, as every run before issue 38 drew it.

    Durations are lognormal with the trace's median and sigma, redrawn above min(p99, cap_s): the
    tail must end well inside the horizon or the run never reaches a steady state."""
    rng = random.Random(seed)
    median, sigma, p99 = DURATIONS[trace]
    cap = min(p99, cap_s)

    def duration(source: random.Random) -> float:
        value = cap + 1
        while value > cap:
            value = source.lognormvariate(math.log(median), sigma)
        return max(value, 1.0)

    # The arrival rate comes from the mean work of a large pilot sample of the same distributions.
    pilot = random.Random(seed + 1)
    pilot_sizes = pilot.choices(BUCKET_SIZES, weights=SIZE_SHARES[trace], k=20000)
    mean_work = sum(min(s, cluster_gpus) * duration(pilot) for s in pilot_sizes) / len(pilot_sizes)
    rate = load * cluster_gpus / mean_work  # arrivals per second
    out, now = [], rng.expovariate(rate)
    while now < horizon_s:
        size = min(rng.choices(BUCKET_SIZES, weights=SIZE_SHARES[trace])[0], cluster_gpus)
        pods, per_pod = shape(size)
        out.append(Job(f"{trace}-{len(out)}", now, duration(rng), pods, per_pod))
        now += rng.expovariate(rate)
    return out


def load_csv(path: str) -> list[Job]:
    """Jobs from a trace CSV in our canonical format (a superset of the Tiresias, Helios/Acme and openb columns):
    job_id, submit_s, duration_s, num_gpus [, gpu_milli, gpu_type, workers, source_nodes, comm_bytes_per_iter].
    Fractional GPUs (gpu_milli < 1000) are rounded up to one whole GPU; CPU-only rows are skipped."""
    try:
        handle = open(path, newline="", encoding="utf-8")
    except OSError as err:
        raise TraceError(f"trace {path}: {err.strerror}") from None
    with handle:
        reader = csv.DictReader(handle)
        header = [h.strip() for h in reader.fieldnames or ()]
        missing = [c for c in CSV_REQUIRED if c not in header]
        if missing:
            raise TraceError(f"trace {path}: missing column(s) {', '.join(missing)}; "
                             f"required: {', '.join(CSV_REQUIRED)}; optional: {', '.join(CSV_OPTIONAL)}")
        jobs = []
        for line, row in enumerate(reader, start=2):
            row = {k.strip(): (v or "").strip() for k, v in row.items() if k}
            gpus = _number(path, line, row, "num_gpus", float)
            workers = int(_number(path, line, row, "workers", float)) if row.get("workers") else None
            if gpus <= 0:
                continue
            whole = max(1, math.ceil(gpus))
            pods, per_pod = shape(whole, workers)
            jobs.append(Job(row["job_id"] or f"row-{line}", _number(path, line, row, "submit_s", float),
                            max(_number(path, line, row, "duration_s", float), 1.0), pods, per_pod))
    if not jobs:
        raise TraceError(f"trace {path}: no GPU jobs (every num_gpus is 0 or the file has no rows)")
    jobs.sort(key=lambda j: j.submit_s)
    start = jobs[0].submit_s
    return [Job(j.job_id, j.submit_s - start, j.duration_s, j.pods, j.gpus_per_pod) for j in jobs]


def _number(path: str, line: int, row: dict, column: str, kind: type) -> float:
    text = row.get(column, "")
    try:
        value = kind(text)
    except ValueError:
        raise TraceError(f"trace {path} line {line}: {column} {text!r} is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise TraceError(f"trace {path} line {line}: {column} {text!r} must be a finite number >= 0")
    return value
