"""bench/twin.py's parts that need no cluster: the virtual clock and its pace, the names and
domains of nodes, the run time charged from where a job's pods bound, the fidelity table from
fabricated runs, and the command line's refusals. The replays themselves need the control plane."""
from types import SimpleNamespace

import pytest

from bench import simulate, twin, twin_kube
from bench.engine import JobRecord, RunResult
from bench.fabric import ClusterSpec, SimCluster
from bench.traces import Job
from bench.twin_model import Charge, Clock, FidelityRow, Placed, domain_of, fidelity, max_pace, node_names, run_result
from bench.twin_report import Stream, fidelity_section


def test_pace_keeps_each_period_at_one_percent_of_the_median_job():
    assert max_pace([50, 100, 400]) == pytest.approx(1.0)  # 1 s is 1% of the 100 s median at pace 1
    assert max_pace([30, 40, 50], periods=(1.0, 2.0)) == pytest.approx(0.2)  # the longer period rules


def test_the_clock_runs_at_its_pace_and_jumps_over_the_quiet():
    clock = Clock(wall=10.0, pace=0.5)
    assert clock.at(14.0) == pytest.approx(2.0)
    clock.jump(wall=14.0, virtual=100.0)
    assert clock.at(16.0) == pytest.approx(101.0)
    assert clock.at(12.0) == pytest.approx(1.0)  # a moment read late keeps the piece its wall time fell in
    assert clock.skipped() == pytest.approx(98.0)
    with pytest.raises(ValueError, match="back in time"):
        clock.jump(wall=16.0, virtual=50.0)
    with pytest.raises(ValueError, match="above 0"):
        Clock(0.0, pace=0.0)


def test_real_nodes_are_named_as_the_simulator_names_them_in_topology_order():
    sim = SimCluster(ClusterSpec())
    names = node_names(sim, twin_kube.real_names(1))
    assert names["gpu-s1-l1-n1"] == "z0-s0-l0-n0"
    assert names["gpu-s4-l8-n8"] == "z1-s1-l1-n7"
    with pytest.raises(ValueError, match="has 10 nodes, the simulated one 64"):
        node_names(sim, twin_kube.real_names(1)[:10])


def test_a_job_is_placed_in_the_narrowest_domain_holding_its_pods():
    sim = SimCluster(ClusterSpec())
    assert domain_of(sim, ["z0-s1-l0-n3", "z0-s1-l0-n3"]) == "node z0-s1-l0-n3"
    assert domain_of(sim, ["z0-s1-l0-n3", "z0-s1-l0-n4"]) == "leaf z0-s1-l0"
    assert domain_of(sim, ["z0-s1-l0-n3", "z0-s1-l1-n4"]) == "spine z0-s1"
    assert domain_of(sim, ["z0-s0-l0-n3", "z1-s1-l1-n4"]) == "cluster"


@pytest.fixture(scope="module")
def workload():
    return twin.stream_of("acme_seren", 11, simulate.parse_network("2/4/8"), 10)[1]


def test_a_job_is_charged_the_slowdown_of_the_nodes_it_bound_to(workload):
    job = Job("wide", 0.0, 1000.0, 2, 8, comm_share=0.5)
    charge = Charge(workload)
    near, near_pods = charge.start(job, ["z0-s0-l0-n0", "z0-s0-l0-n1"], began=5.0)
    assert sum(charge.mirror.free_count) == 512 - 16  # the mirror holds its GPUs
    far, _ = charge.start(job, ["z0-s0-l0-n2", "z1-s0-l0-n0"], began=5.0)
    assert near.start_s == 5.0 and near.run_s == pytest.approx(1000.0)  # the tightest placement: the trace's time
    assert far.run_s > near.run_s  # across zones its all-reduce crosses the oversubscribed links
    charge.finish(near_pods)
    assert sum(charge.mirror.free_count) == 512 - 16
    with pytest.raises(ValueError, match="1 nodes for 2 pods"):
        charge.start(job, ["z0-s0-l0-n3"], began=6.0)


def record(job: Job, start: float, run: float = 100.0) -> JobRecord:
    return JobRecord(job, start, run, 0, 0, 0, 1, 1, 0.0, 0.0)


def test_allocation_counts_gpu_time_inside_the_window_only():
    job = Job("a", 0.0, 100.0, 1, 8)
    result = run_result("p", [record(job, 50.0)], [], (0.0, 100.0), 16, 0, 0)
    assert result.allocation == pytest.approx(8 * 50 / (16 * 100))


def row(start_sim, start_twin, sim_domain="node z0-s0-l0-n0", twin_domain="node z0-s0-l0-n0"):
    return FidelityRow(Job("j", 0.0, 10.0, 1, 1), False,
                       Placed(start_sim, sim_domain if start_sim is not None else None),
                       Placed(start_twin, twin_domain if start_twin is not None else None))


def test_fidelity_counts_agreement_and_start_errors():
    f = fidelity([row(10.0, 10.5), row(10.0, 13.0, twin_domain="node z0-s0-l0-n1"),
                  row(10.0, None), row(None, 4.0), row(20.0, 19.0, twin_domain="leaf z0-s0-l0")])
    assert (f.jobs, f.compared, f.same_domain, f.same_level) == (5, 3, 1, 2)
    assert (f.error_p50_s, f.error_max_s, f.within_1s) == (1.0, 3.0, 2)
    assert f.mean_error_s == pytest.approx((0.5 + 3.0 - 1.0) / 3)
    assert (f.only_simulated, f.only_twin) == (1, 1)


def test_the_fidelity_table_lists_disagreements_and_every_job_in_the_tsv():
    jobs = [Job("s-0", 0.0, 100.0, 1, 8), Job("s-1", 1.0, 100.0, 2, 8), Job("s-2", 2.0, 100.0, 1, 1)]

    def result(starts: dict[str, float], placed: dict[str, tuple[str, ...]]) -> RunResult:
        out = RunResult("kueue", records=[record(j, starts[j.job_id]) for j in jobs if j.job_id in starts])
        out.placed = placed
        return out

    simulated = result({"s-0": 0.0, "s-1": 1.0, "s-2": 2.0},
                       {"s-0": ("z0-s0-l0-n0",), "s-1": ("z0-s0-l0-n1", "z0-s0-l0-n2"), "s-2": ("z0-s0-l0-n3",)})
    replayed = result({"s-0": 0.2, "s-1": 1.4}, {"s-0": ("z0-s0-l0-n0",), "s-1": ("z0-s0-l0-n1", "z1-s0-l0-n2")})
    stream = Stream("acme_seren", 11, None, SimpleNamespace(jobs=jobs, spec=ClusterSpec()), frozenset({"s-0"}),
                    {"kueue": simulated}, {"kueue": replayed},
                    {"kueue": SimpleNamespace(notes={"s-2": "waits for a leaf"})})
    text, table = fidelity_section([stream], ("kueue",))
    report = "\n".join(text)
    assert "| kueue | 3 | 33% | 33% | 2 | 100% | 0.2 | 0.4 | 0.4 | +0.3 | 1 / 0 |" in report
    assert "Disagreements: 2" in report
    assert "| s-1 | 16 (2x8) |  | 1.0 s, leaf z0-s0-l0 | 1.4 s, cluster |" in report
    assert "| s-2 | 1 (1x1) |  | 2.0 s, node z0-s0-l0-n3 | not started | waits for a leaf |" in report
    lines = table.splitlines()
    assert len(lines) == 1 + len(jobs)
    assert lines[1].split("\t")[6] == "1"  # s-0 is foreign


@pytest.mark.parametrize("argv, message", [
    (["--jobs", "1"], "--jobs must be 2 or more"),
    (["--pace", "0"], "--pace, --timeout and --n-seeds above 0"),
    (["--network", "2/x/8"], "2/x/8"),
    (["--seeds", "1000"], "1000 seen before"),
    (["--seeds", "11", "--allow-seen", "--traces", "acme_seren", "--pace", "50"], "median job is"),
])
def test_bad_arguments_are_refused_with_a_message(argv, message, capsys):
    with pytest.raises(SystemExit) as exited:
        twin.main(argv)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_a_foreign_job_is_steered_to_its_simulated_nodes_and_asks_cpu_in_proportion():
    required = twin_kube.KueueBestFit("required")
    job = Job("f", 0.0, 10.0, 2, 4)
    manifest = twin_kube.job_manifest(job, "job-0", twin_kube.MODES["kueue"], True, required, "p1",
                                      ("gpu-s1-l1-n1", "gpu-s1-l1-n2"))
    pod = manifest["spec"]["template"]["spec"]
    assert "labels" not in manifest["metadata"]  # not queued in Kueue: kube-scheduler's
    assert pod["nodeSelector"] == {twin_kube.PARTITION: "p1"}
    # preferred: a node taken in the twin but free in the simulation must not hold the job back
    terms = pod["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert terms[0]["preference"]["matchExpressions"][0]["values"] == ["gpu-s1-l1-n1", "gpu-s1-l1-n2"]
    # kube-scheduler scores cpu and memory: in proportion to the GPUs, it spreads by GPUs
    assert pod["containers"][0]["resources"]["requests"] == {"cpu": "48", "memory": "948Gi"}
