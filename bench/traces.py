"""Job streams: synthetic ones sampled from published trace distributions, and a loader for real traces.

Size shares are job-count % per size bucket, read from the published CDF figures
(https://github.com/InternLM/AcmeTrace figure/cdf_job_gpunum.pdf for Philly, Helios and Acme;
https://github.com/S-Lab-System-Group/HeliosArtifact for the Helios clusters); duration medians and
p99s from AcmeTrace figure/cdf_job_duration_util.pdf and data/cluster_summary.csv, lognormal sigmas
fitted from p50/p90. Each size bucket is drawn as one representative size (3-4 is "mostly 4" and 5-8
"mostly 8"; wider buckets take their power of two), so every job above 8 GPUs is whole 8-GPU pods.
"""
from __future__ import annotations

import csv
import math
import random
from dataclasses import dataclass

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
                  seed: int) -> list[Job]:
    """Poisson arrivals over `horizon_s` whose offered load (GPU-seconds asked per second / GPUs) is `load`.

    Durations are lognormal with the trace's median and sigma, redrawn above min(p99, cap_s): the
    tail must end well inside the horizon or the run never reaches a steady state."""
    if trace not in SIZE_SHARES:
        raise ValueError(f"trace {trace!r} is not one of {', '.join(SIZE_SHARES)}")
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
