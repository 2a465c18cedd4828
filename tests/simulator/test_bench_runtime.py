"""The cluster as it runs (bench/engine.py, Runtime; issue 38 item 3): when ours decides, the
releaser's period and latency, and the jobs that are not ours."""
import hashlib
from dataclasses import replace

import pytest

from bench import balanced, costmodel, engine, evaluate, fabric, policies, simulate, traces
from webhook.core.model import Strategy

QUICK = fabric.ClusterSpec(zones=1, spines_per_zone=2, leaves_per_spine=2, nodes_per_leaf=4)  # 128 GPUs
SHAPES = [(1, 1), (1, 2), (1, 4), (1, 8), (2, 8), (3, 8), (1, 1), (5, 8), (1, 2), (9, 8)]
NO_FOREIGN = engine.Runtime(foreign_share=0.0, kueue_ungate_s=0.0)


def overloaded_stream(count=240):
    """An overloaded stream from integer arithmetic alone (no random module: one interpreter draws
    what another does), with waits of every kind."""
    state, now, jobs = 12345, 0.0, []
    for i in range(count):
        state = (state * 1103515245 + 12345) % 2**31
        now += 1 + state % 40
        pods, gpus = SHAPES[state % len(SHAPES)]
        jobs.append(traces.Job(f"j{i}", now, 30 + (state >> 8) % 900, pods, gpus))
    return tuple(jobs)


def run(key, runtime, jobs=None, spec=QUICK, seed=7):
    workload = engine.Workload(spec, costmodel.Network(), jobs or overloaded_stream(), 0.1, 1e9, seed, 0.0, runtime)
    return engine.run(workload, simulate.make_policy(key, costmodel.Network(), 0.1))


def digest(result):
    text = repr([(r.job.job_id, round(r.start_s, 6), round(r.run_s, 6), r.span, r.nodes) for r in result.records]
                + [result.rejected, result.unstarted])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# The records of the engine before issue 38 (commit c47e2f8), on overloaded_stream.
BEFORE_ISSUE_38 = {"spread": "689e44db7c9f52c9", "kueue": "276216e0d63b2f3d", "kueue-strict": "c81eca0cb47d96e0",
                   "ours-consolidated": "1ee8c3af7e8ab042", "ours-distributed": "94007776480d0550"}


@pytest.mark.parametrize("key", sorted(BEFORE_ISSUE_38))
def test_the_ideal_runtime_reproduces_the_records_before_issue_38(key):
    """No foreign jobs, releaser period, latency and Kueue's ungating 0, ours asked when the job fits:
    today's records."""
    assert engine.Runtime(0.0, 0.0, 0.0, decide_at_arrival=False, kueue_ungate_s=0.0) == engine.IDEAL
    assert digest(run(key, engine.IDEAL)) == BEFORE_ISSUE_38[key]


def test_the_runtime_moves_ours_records_and_the_baselines_only_through_foreign_jobs():
    """Deciding at arrival and the releaser's ticks concern ours alone: without foreign jobs the
    baselines' records stay what they were, ours' move."""
    assert digest(run("kueue", NO_FOREIGN)) == BEFORE_ISSUE_38["kueue"]
    assert digest(run("ours-consolidated", NO_FOREIGN)) != BEFORE_ISSUE_38["ours-consolidated"]
    assert digest(run("kueue", engine.Runtime())) != BEFORE_ISSUE_38["kueue"]


def test_kueue_runs_a_job_from_its_ungating_after_admission_and_ours_at_once():
    """Kueue's topology ungater lifts the pods' gate a batch period after admission (the twin saw
    1.1 s); ours' pods are bound as they are created."""
    jobs = (traces.Job("a", 5.0, 100.0, 2, 8), traces.Job("b", 7.0, 100.0, 1, 1))
    ungated = replace(NO_FOREIGN, kueue_ungate_s=1.0)
    assert [r.start_s for r in run("kueue", ungated, jobs).records] == [6.0, 8.0]
    assert [r.start_s for r in run("ours-consolidated", ungated, jobs).records] == [5.0, 7.0]


class AskedAt(policies.Ours):
    """Ours, noting when it is first asked for each job."""

    def __init__(self, **settings):
        super().__init__(Strategy.CONSOLIDATED, costmodel.Network(), **settings)
        self.first_asked = {}

    def place(self, job):
        self.first_asked.setdefault(job.job_id, self.now)
        return super().place(job)


FOUR_NODES = fabric.ClusterSpec(zones=1, spines_per_zone=1, leaves_per_spine=2, nodes_per_leaf=2)
TWO_NODES = fabric.ClusterSpec(zones=1, spines_per_zone=1, leaves_per_spine=1, nodes_per_leaf=2)


def full_then_big(spec, fill_s, big_at=1.0):
    """Every node taken by a one-node job that runs `fill_s`, then a job of two whole nodes."""
    nodes = spec.gpus // fabric.GPUS_PER_NODE
    return tuple(traces.Job(f"fill{i}", 0.0, fill_s, 1, 8) for i in range(nodes)) + (
        traces.Job("big", big_at, 100.0, 2, 8),)


def run_ours(jobs, runtime, spec, seed=1):
    policy = AskedAt(communication_share=1.0)
    result = engine.run(engine.Workload(spec, costmodel.Network(), jobs, 0.0, 1e9, seed, 0.0, runtime), policy)
    return policy, result


@pytest.mark.parametrize("runtime, asked_at", [(NO_FOREIGN, 1.0), (engine.IDEAL, 10.2)])
def test_ours_decides_a_job_when_its_pods_are_created(runtime, asked_at):
    """The webhook decides as the pods are created, room or not; IDEAL asks it first once the
    cluster has as many free GPUs as the job."""
    policy, _ = run_ours(full_then_big(FOUR_NODES, 10.2), runtime, FOUR_NODES)
    assert policy.first_asked["big"] == asked_at


@pytest.mark.parametrize("period, latency, start", [(1.0, 0.05, 11.05), (0.0, 0.05, 10.25), (4.0, 0.0, 12.0),
                                                    (0.0, 0.0, 10.2)])
def test_a_gated_job_starts_at_the_releasers_next_tick_plus_the_patch_latency(period, latency, start):
    """Every node full, a job of two nodes gated at arrival; every node frees at 10.2 s. The
    releaser's next pass (ticks at multiples of its period) starts it, and it runs once patched."""
    runtime = engine.Runtime(period, latency, 0.0)
    policy, result = run_ours(full_then_big(FOUR_NODES, 10.2), runtime, FOUR_NODES)
    big = next(r for r in result.records if r.job.job_id == "big")
    assert policy.first_asked["big"] == 1.0 and big.start_s == pytest.approx(start)


def seed_where_only(foreign_id, ids, share):
    """The first seed under which, of `ids`, only `foreign_id` is drawn not ours."""
    return next(seed for seed in range(1000)
                if engine.foreign_jobs([traces.Job(i, 0, 1, 1, 1) for i in ids], share, seed) == {foreign_id})


@pytest.mark.parametrize("intruder_at, big_starts", [(10.5, 111.05), (11.5, 11.05)])
def test_a_foreign_job_arriving_before_the_releasers_tick_takes_the_freed_gpus(intruder_at, big_starts):
    """Both nodes full until 10.2 s, a job of both gated for them. kube-scheduler places a job that
    is not ours as it arrives: at 10.5 s it takes a freed node before the releaser's tick at 11 s,
    and the gated job waits for it to end (110.5 s, tick 111 s); at 11.5 s it comes too late."""
    jobs = full_then_big(TWO_NODES, 10.2) + (traces.Job("intruder", intruder_at, 100.0, 1, 8),)
    runtime = engine.Runtime(1.0, 0.05, 0.5)
    seed = seed_where_only("intruder", [j.job_id for j in jobs], runtime.foreign_share)
    _, result = run_ours(jobs, runtime, TWO_NODES, seed)
    assert [r.job.job_id for r in result.foreign] == ["intruder"]
    assert "intruder" not in {r.job.job_id for r in result.records}
    starts = {r.job.job_id: r.start_s for r in (*result.records, *result.foreign)}
    assert starts["big"] == pytest.approx(big_starts)
    assert starts["intruder"] == pytest.approx(intruder_at if intruder_at < 11 else 111.05)  # else once big ends


def test_foreign_jobs_are_the_same_under_every_policy_and_kept_out_of_its_records():
    jobs = overloaded_stream()
    foreign = engine.foreign_jobs(jobs, 0.3, 7)
    assert 0.2 < len(foreign) / len(jobs) < 0.4
    assert foreign < engine.foreign_jobs(jobs, 0.5, 7)  # a larger share keeps the smaller one's jobs
    for key in ("spread", "kueue", "ours-consolidated"):
        result = run(key, engine.Runtime())
        ran = {r.job.job_id for r in result.foreign}
        assert ran <= foreign and len(ran) + result.foreign_unstarted == len(foreign)
        assert not {r.job.job_id for r in result.records} & foreign


@pytest.mark.parametrize("argv, message", [
    (["--foreign-share", "1.5"], "foreign share 1.5 between 0 and 1"),
    (["--releaser-period", "-1"], "must be 0 or more")])
def test_the_runtime_flags_refuse_what_cannot_run(capsys, argv, message):
    with pytest.raises(SystemExit):
        simulate.main(["--quick", *argv])
    assert message in capsys.readouterr().err


def test_the_runtime_flags_reach_every_scenario_and_its_label():
    runtime = engine.Runtime(2.0, 0.1, 0.0)
    assert {s.runtime for s in simulate.scenarios(simulate.QUICK, True, None, runtime)} == {runtime}
    sweep = simulate.sweep_scenarios(simulate.QUICK, (5,), [simulate.Network()], runtime=runtime)
    assert {s.runtime for s in sweep} == {runtime}
    assert simulate.workload_for(sweep[0], simulate.QUICK).runtime == runtime
    assert sweep[0].label.endswith("releaser every 2 s + 100 ms, 0% not ours")
    assert simulate.runtime_flags(runtime) == ["--releaser-period 2", "--patch-latency 0.1", "--foreign-share 0"]
    assert simulate.runtime_flags(engine.Runtime()) == [] and simulate.Scenario("main", "philly", 0.5).runtime == \
        engine.Runtime()
    assert simulate.runtime_flags(replace(engine.IDEAL)) == ["--releaser-period 0", "--patch-latency 0",
                                                            "--foreign-share 0", "--decide-when-it-fits",
                                                            "--kueue-ungate 0"]


@pytest.mark.parametrize("runtime", [engine.IDEAL, engine.Runtime()])
def test_balanced_runs_as_consolidated_so_it_has_no_column(runtime):
    """Balanced differs from consolidated only where a placed job's preferred domain has no room as
    its pods bind; the simulator binds a decision as it is made, so the records are the same
    (docs/design/evaluation.md, "Balanced: no column of its own"). Should they ever differ, the
    column is due back."""
    assert digest(run("ours-balanced", runtime)) == digest(run("ours-consolidated", runtime))
    assert "ours-balanced" not in simulate.SWEEP_KEYS + evaluate.OURS_VARIANTS


def test_the_releases_a_foreign_pod_could_race_are_those_with_an_arrival_inside_their_latency():
    """bench/balanced.py's count: a job the releaser started runs from a whole-second tick plus the
    latency; a foreign job that arrives inside that window could take its GPUs in a real cluster."""
    def record(job_id, submit_s, start_s):
        return engine.JobRecord(traces.Job(job_id, submit_s, 60, 2, 8), start_s, 60, 2, 2, 2, 2, 1, 0.1, 0.1)

    result = engine.RunResult("ours", records=[record("a", 3.2, 5.05),  # released at the tick of 5 s
                                               record("b", 7.0, 7.0),  # started as it arrived
                                               record("c", 8.5, 10.05)],  # released at 10 s
                              foreign=[record("f1", 5.02, 5.02), record("f2", 9.0, 9.0), record("f3", 10.05, 10.05)])
    assert balanced.raced_releases(result, 0.05) == (2, 1)  # f1 inside a's window; f3 arrives as c runs
    # At the tick's own instant an arrival comes before the releaser's pass (bench/engine.py): no race.
    result.foreign[0] = record("f1", 5.0, 5.0)
    assert balanced.raced_releases(result, 0.05) == (2, 0)
