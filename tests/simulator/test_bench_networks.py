"""The simulator's network sweep and Kueue's modes (issue 38): what is charged, what ours is told,
and Kueue's required topology and StrictFIFO queue. Tiny clusters and hand-made jobs only."""
import dataclasses

import pytest

from bench import costmodel, engine, fabric, policies, simulate, traces

TWO_ZONES = fabric.ClusterSpec(zones=2, spines_per_zone=1, leaves_per_spine=1, nodes_per_leaf=2)
TWO_LEAVES = fabric.ClusterSpec(zones=1, spines_per_zone=1, leaves_per_spine=2, nodes_per_leaf=3)
THREE_NODES = fabric.ClusterSpec(zones=1, spines_per_zone=1, leaves_per_spine=1, nodes_per_leaf=3)
# The quick cluster, a shorter stream: a run takes a fraction of a second.
TINY = dataclasses.replace(simulate.QUICK, horizon_s=2 * 1800)


def names(cluster, **where):
    return [n.name for n in cluster.nodes if all(getattr(n, k) == v for k, v in where.items())]


# -- what the simulator charges ----------------------------------------------------------------------

def test_a_ring_across_zones_is_charged_by_the_scenarios_tiers():
    """Two whole nodes in two zones: under 2/4/8 the ring's NIC bandwidth is divided by 2 x 4 x 8;
    under 1/1/1 crossing costs no bandwidth at all (only the per-hop latency of the longer path,
    which oversubscription does not change)."""
    cluster = fabric.SimCluster(TWO_ZONES)
    profile = TWO_ZONES.hardware.profile
    across = {cluster.nodes[0].name: tuple(range(8)), cluster.nodes[2].name: tuple(range(8))}
    inside = {cluster.nodes[0].name: tuple(range(8)), cluster.nodes[1].name: tuple(range(8))}
    assert fabric.span_level(cluster, across) == fabric.CLUSTER and fabric.span_level(cluster, inside) == fabric.LEAF
    flat = simulate.Scenario("sweep", "helios_all", 0.8, rho_leaf=1, rho_spine=1, rho_zone=1).network
    tiered = simulate.Scenario("sweep", "helios_all", 0.8, rho_leaf=2, rho_spine=4, rho_zone=8).network
    assert tiered == costmodel.Network(2, 4, 8) and flat == costmodel.Network(1, 1, 1)

    def bandwidth(network, placement):
        return costmodel.bus_bandwidth_gbs(cluster, profile, network, placement)

    def seconds(network, placement):
        return costmodel.allreduce_seconds(cluster, profile, network, placement, 1e9)

    assert bandwidth(flat, across) == bandwidth(flat, inside) == bandwidth(tiered, inside)
    assert bandwidth(tiered, across) == bandwidth(flat, across) / 64
    latency = 2 * 15 * (costmodel.ALPHA_S[fabric.CLUSTER] - costmodel.ALPHA_S[fabric.LEAF])
    assert seconds(flat, across) - seconds(flat, inside) == pytest.approx(latency)
    assert seconds(tiered, across) > 30 * seconds(flat, across)


class Across(policies.Policy):
    """Places every job's pods one per node, node i of zone i: a 2-pod job spans the zones."""

    def place(self, job):
        return [(self.cluster.nodes[2 * i].name, tuple(range(job.gpus_per_pod))) for i in range(job.pods)]


@pytest.mark.parametrize("rho, flat", [((1, 1, 1), True), ((2, 4, 8), False)])
def test_the_engine_charges_the_scenarios_network_and_share(rho, flat):
    """The workload carries the charged network and share, and a job's run time stretches by them."""
    scenario = simulate.Scenario("sweep", "helios_all", 0.8, comm_fraction=0.5, rho_leaf=rho[0], rho_spine=rho[1],
                                 rho_zone=rho[2], configured_rho=(4, 8, 16), configured_comm=0.1)
    workload = simulate.workload_for(scenario, TINY)
    assert workload.network == costmodel.Network(*rho) and workload.comm_fraction == 0.5
    job = traces.Job("ring", 0, 1000, 2, 8)
    charged = engine.Workload(TWO_ZONES, workload.network, (job,), workload.comm_fraction, 1e9, 1, 0.0)
    record, = engine.run(charged, Across()).records
    assert record.span == fabric.CLUSTER
    slowdown = record.allreduce_s / record.ideal_allreduce_s
    assert record.run_s == pytest.approx(1000 * (0.5 + 0.5 * slowdown))
    if flat:
        assert 1 < slowdown < 1.02  # only the longer path's latency
    else:
        assert slowdown > 30


# -- what ours is told ---------------------------------------------------------------------------------

@pytest.mark.parametrize("key", ["ours-consolidated", "ours-balanced", "ours-distributed",
                                 "ours-consolidated-unprotected", "ours-without-aligned-first"])
def test_ours_is_configured_with_the_configured_values_not_the_charged_ones(key):
    scenario = simulate.Scenario("sweep", "helios_all", 0.8, comm_fraction=0.1, rho_leaf=2, rho_spine=4, rho_zone=8,
                                 configured_rho=(4, 8, 16), configured_comm=0.2)
    config = simulate.policy_for(scenario, key).config
    zone, spine, leaf = config.levels
    # a level's oversubscription divides traffic crossing its children: zone -> spines, spine -> leaves
    assert (zone.oversubscription, spine.oversubscription, leaf.oversubscription) == (8, 4, 1)
    assert config.cluster_oversubscription == 16 and config.communication_share == 0.2
    assert not config.levels_auto
    told = simulate.policy_for(dataclasses.replace(scenario, configured_rho=None, configured_comm=None), key).config
    assert [lv.oversubscription for lv in told.levels] == [4, 2, 1]
    assert told.cluster_oversubscription == 8 and told.communication_share == 0.1


def test_misconfiguring_scales_what_a_config_may_hold_and_drops_what_clamps_back_to_the_truth():
    exact = simulate.Scenario("sweep", "helios_all", 0.8, rho_leaf=1, rho_spine=2, rho_zone=2)
    high = simulate.misconfigured(exact, 2, "network")
    assert high.configured_network == costmodel.Network(2, 4, 4) and high.configured_share == exact.comm_fraction
    low = simulate.misconfigured(exact, 0.5, "network")
    assert low.configured_network == costmodel.Network(1, 1, 1)  # a Config holds no oversubscription below 1
    both = simulate.misconfigured(exact, 2, "both")
    assert both.configured_share == pytest.approx(0.2) and both.configured_network == costmodel.Network(2, 4, 4)
    assert simulate.misconfigured(exact, 20, "share").configured_share == 1.0
    assert simulate.misconfigured(simulate.Scenario("sweep", "helios_all", 0.8, rho_leaf=1, rho_spine=1, rho_zone=1),
                                  0.5, "network").told_the_truth
    grid = simulate.sweep_scenarios(TINY, (1,), [costmodel.Network(1, 1, 1), costmodel.Network(2, 4, 8)], (0.5, 2))
    configured = [(simulate.network_text(s.network), simulate.configured_text(s)) for s in grid]
    assert configured == [("1/1/1", "exact"), ("1/1/1", "comm 0.05 (0.5x)"), ("1/1/1", "rho 2/2/2 (2x)"),
                          ("1/1/1", "comm 0.2 (2x)"),
                          ("2/4/8", "exact"), ("2/4/8", "rho 1/2/4 (0.5x)"), ("2/4/8", "comm 0.05 (0.5x)"),
                          ("2/4/8", "rho 4/8/16 (2x)"), ("2/4/8", "comm 0.2 (2x)")]
    tasks = simulate.sweep_tasks(grid, simulate.SWEEP_KEYS, TINY)
    assert {key for s, key, _ in tasks if not s.told_the_truth} == {k for k in simulate.SWEEP_KEYS if "ours" in k}


# -- the default run is today's ------------------------------------------------------------------------

def fingerprint(summary):
    return dataclasses.replace(summary, run_wall_s=0.0, decision_p50_us=0.0, decision_p99_us=0.0)


def test_the_default_network_passed_explicitly_gives_the_same_run():
    default = simulate.Scenario("main", "helios_all", 0.8)
    explicit = simulate.Scenario("main", "helios_all", 0.8, comm_fraction=0.1, rho_leaf=2, rho_spine=4, rho_zone=8,
                                 configured_rho=(2, 4, 8), configured_comm=0.1)
    assert default.label == "helios_all load 0.8, h100, comm 0.1, rho_leaf 2" == explicit.label
    assert default.network == costmodel.Network() and explicit.told_the_truth
    for key in ("kueue", "ours-consolidated"):
        runs = [fingerprint(simulate.run_one((s, key, TINY))[2]) for s in (default, explicit)]
        assert runs[0] == runs[1] and runs[0].jobs > 40


def test_the_default_grid_keeps_its_policies():
    assert simulate.POLICY_KEYS == ("spread", "best-fit", "random", "kueue", "ours-consolidated", "ours-distributed")
    assert simulate.EXTENDED_KEYS == simulate.POLICY_KEYS + ("kueue-required", "kueue-strict")
    assert {key for s in simulate.scenarios(simulate.FULL, False, None) for key in s.policies} == set(
        simulate.POLICY_KEYS + simulate.HYBRID_KEYS)
    assert simulate.make_policy("kueue", costmodel.Network(), 0.1).name == "Kueue TAS BestFit"


# -- Kueue's required topology -------------------------------------------------------------------------

class Seeded(policies.KueueBestFit):
    """Kueue, except that the jobs named in `where` go to the nodes given (to set up a cluster)."""

    def __init__(self, where, **mode):
        super().__init__(**mode)
        self.where = where

    def place(self, job):
        if job.job_id in self.where:
            return [(self.cluster.nodes[i].name, tuple(range(job.gpus_per_pod))) for i in self.where[job.job_id]]
        return super().place(job)


def test_kueue_required_asks_for_the_narrowest_level_that_holds_the_job_idle():
    kueue = policies.KueueBestFit(topology="required")
    kueue.reset(fabric.SimCluster(TWO_LEAVES), 1)
    assert [kueue.required_level(pods, 8) for pods in (2, 3, 4, 6, 7)] == ["leaf", "leaf", "spine", "spine", None]
    assert kueue.required_level(2, 4) == "hostname" and kueue.required_level(6, 4) == "leaf"
    assert kueue.fit_class((3, 8)) != kueue.fit_class((4, 8)) and kueue.fit_class((1, 8)) is None
    preferred = policies.KueueBestFit()
    preferred.reset(fabric.SimCluster(TWO_LEAVES), 1)
    assert preferred.required_level(3, 8) is None


def test_kueue_required_waits_for_its_level_instead_of_placing_wider():
    """Each leaf of three nodes has one taken: a job of 3 x 8 is required at leaf and waits until a
    leaf frees, where the preferred mode spans both leaves at once. One of 4 x 8, required at the
    spine, starts meanwhile: the leaf job's wait says nothing of it."""
    seeds = {"fill-a": [0], "fill-b": [3]}
    jobs = (traces.Job("fill-a", 0, 1000, 1, 8), traces.Job("fill-b", 0, 2000, 1, 8),
            traces.Job("leaf-job", 1, 10, 3, 8), traces.Job("spine-job", 2, 10, 4, 8))
    workload = engine.Workload(TWO_LEAVES, costmodel.Network(), jobs, 0.0, 1e9, 1, 0.0)
    required = {r.job.job_id: r for r in engine.run(workload, Seeded(seeds, topology="required")).records}
    assert required["spine-job"].start_s == 2 and required["spine-job"].span == fabric.SPINE
    assert required["leaf-job"].start_s == 1000 and required["leaf-job"].span == fabric.LEAF
    preferred = {r.job.job_id: r for r in engine.run(workload, Seeded(seeds)).records}
    assert preferred["leaf-job"].start_s == 1 and preferred["leaf-job"].span == fabric.SPINE


def test_kueue_required_places_nothing_wider_than_its_level_on_a_busy_cluster():
    """Asked directly, on every state of a small cluster filling up: an answer is always inside one
    domain of the required level."""
    spec = fabric.ClusterSpec(zones=2, spines_per_zone=2, leaves_per_spine=2, nodes_per_leaf=2)
    cluster = fabric.SimCluster(spec)
    kueue = policies.KueueBestFit(topology="required")
    kueue.reset(cluster, 1)
    level_of = {"hostname": fabric.NODE, "leaf": fabric.LEAF, "spine": fabric.SPINE, "zone": fabric.ZONE}
    placed = waited = 0
    for step in range(40):
        for pods, gpus in ((2, 8), (3, 8), (5, 8), (2, 4), (3, 4)):
            answer = kueue.place(traces.Job(f"j{step}-{pods}-{gpus}", 0, 1, pods, gpus))
            if answer is None:
                waited += 1
                continue
            placed += 1
            merged = {}
            for node, ids in answer:
                merged[node] = merged.get(node, ()) + ids
            assert fabric.span_level(cluster, merged) <= level_of[kueue.required_level(pods, gpus)]
        node = cluster.nodes[(step * 7) % len(cluster.nodes)]  # take some GPUs somewhere
        free = sorted(node.free)[:3]
        if free:
            cluster.take(node.name, tuple(free))
    assert placed and waited


# -- Kueue's StrictFIFO ----------------------------------------------------------------------------------

def test_kueue_strict_holds_a_job_behind_a_blocked_head_that_best_effort_admits():
    """Three nodes, one taken until 500 and one until 1000: a 3 x 8 job at the head cannot start;
    a 1 x 4 behind it fits the third node. BestEffortFIFO starts it at once; StrictFIFO keeps it
    behind the head, also when the release at 500 still leaves the head short, and starts it once
    the head, started at 1000 on all three nodes, is done. A job that can never fit (more GPUs than
    the cluster) is rejected and blocks nothing."""
    jobs = (traces.Job("long", 0, 1000, 1, 8), traces.Job("short", 0, 500, 1, 8), traces.Job("never", 0.5, 10, 4, 8),
            traces.Job("big", 1, 10, 3, 8), traces.Job("small", 2, 10, 1, 4))
    workload = engine.Workload(THREE_NODES, costmodel.Network(), jobs, 0.0, 1e9, 1, 0.0)
    best_effort = engine.run(workload, simulate.make_policy("kueue", costmodel.Network(), 0.1))
    strict = engine.run(workload, simulate.make_policy("kueue-strict", costmodel.Network(), 0.1))
    assert {r.job.job_id: r.start_s for r in best_effort.records} == {"long": 0, "short": 0, "big": 1000, "small": 2}
    assert {r.job.job_id: r.start_s for r in strict.records} == {"long": 0, "short": 0, "big": 1000, "small": 1010}
    assert best_effort.rejected == strict.rejected == 1
    assert strict.policy == "Kueue TAS BestFit, StrictFIFO"


def test_kueue_strict_starts_jobs_in_submit_order_on_a_sampled_stream():
    workload = simulate.workload_for(simulate.Scenario("main", "helios_all", 1.2), TINY)
    result = engine.run(workload, simulate.make_policy("kueue-strict", workload.network, 0.1))
    starts = [r.start_s for r in sorted(result.records, key=lambda r: r.job.submit_s)]
    assert starts == sorted(starts) and result.unstarted == 0 and len(result.records) > 50


# -- the command line ------------------------------------------------------------------------------------

def test_a_quick_sweep_tables_every_network_configuration_and_kueue_mode(capsys):
    assert simulate.main(["--quick", "--processes", "1", "--networks", "1/1/1", "2/4/8", "--misconfigured", "2",
                          "--misconfigure", "both", "--kueue-modes"]) == 0
    out = capsys.readouterr().out
    rows = [[c.strip() for c in line.strip("| ").split("|")] for line in out.splitlines()
            if line.startswith("| 1/1/1") or line.startswith("| 2/4/8")]
    configurations = {(r[0], r[1]) for r in rows}
    assert configurations == {("1/1/1", "exact"), ("1/1/1", "rho 2/2/2 (2x), comm 0.2 (2x)"),
                              ("2/4/8", "exact"), ("2/4/8", "rho 4/8/16 (2x), comm 0.2 (2x)")}
    policies_run = {r[2] for r in rows if len(r) == 12 and r[1] == "exact"}
    assert {"Kueue TAS BestFit", "Kueue TAS BestFit, required", "Kueue TAS BestFit, StrictFIFO",
            "ours (consolidated)"} <= policies_run and "ours (balanced)" not in policies_run
    versus = [r for r in rows if len(r) == 6]
    assert {(r[2], r[3]) for r in versus if r[:2] == ["2/4/8", "exact"]} == {
        ("ours (consolidated)", kueue)
        for kueue in ("Kueue TAS BestFit", "Kueue TAS BestFit, required", "Kueue TAS BestFit, StrictFIFO")}


@pytest.mark.parametrize("argv, message", [(["--networks", "2/4"], "LEAF/SPINE/ZONE"),
                                           (["--networks", "0.5/1/1"], "each 1 to 1000"),
                                           (["--misconfigured", "0"], "above 0"),
                                           (["--kueue-modes", "--trace-csv", "x.csv"], "not part of a sweep")])
def test_a_sweep_refuses_bad_arguments(capsys, argv, message):
    with pytest.raises(SystemExit) as exit_:
        simulate.main(["--quick", *argv])
    assert exit_.value.code == 2 and message in capsys.readouterr().err
