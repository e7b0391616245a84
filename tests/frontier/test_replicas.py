"""Two-dimensional plans on the frontier: on a cluster of hosts of one shape the frontier also
holds plans data parallel across the hosts with the search's plan inside each (source
``hosts``), every one's figures its simulated step on the replica's capture; a cluster of one
host, or a batch the hosts do not divide, has none (a note says why)."""

from pathlib import Path

import pytest
from conftest import run_cli

import tensoropt
from tensoropt import simulate
from tensoropt.frontier import REPLICAS_SOURCE, host_groups
from tensoropt.workflow import Request, explore

MLP = f"{Path(__file__).parents[1] / 'distributed' / 'segment_models.py'}:residual_mlp"   # batch 1,024, 12 K params


def test_host_groups_are_the_hosts_in_cluster_order_when_they_match():
    assert host_groups(tensoropt.load_cluster("preset:h100-hosts?hosts=3&gpus=2")) == (
        ("h0g0", "h0g1"), ("h1g0", "h1g1"), ("h2g0", "h2g1"))
    assert host_groups(tensoropt.load_cluster("preset:2x4-ethernet"))[1] == ("b0", "b1", "b2", "b3")
    assert host_groups(tensoropt.load_cluster("preset:titan-rtx-5")) == ()          # one host
    cluster = tensoropt.load_cluster("preset:h100-hosts?hosts=2&gpus=2")
    assert host_groups(cluster, ["h0g0", "h0g1", "h1g0"]) == ()                       # hosts of 2 and 1


@pytest.fixture(scope="module")
def two_hosts():
    return explore(Request(MLP, "preset:h100-hosts?hosts=2&gpus=2", algos=()))


def test_data_parallel_across_hosts_joins_where_it_dominates_and_costs_what_it_says(two_hosts):
    fr = two_hosts.frontier
    hosts = [p for p in fr if p.source == REPLICAS_SOURCE]
    # a large batch and few parameters: only gradients cross InfiniBand, so the fastest plans on
    # all four GPUs that tensoropt's executor runs are data parallel across the hosts (each host its
    # plan on 512 of the 1,024); FSDP2's recipe, priced as PyTorch runs it (its gathers prefetched
    # under compute), is a point of its own; so is HSDP (source hsdp: FSDP2 sharding over each host's two
    # GPUs, its shards all-reduced across the hosts — the whole model a device, replicated over all four,
    # each on 256 rows)
    executor = [p for p in fr if p.num_devices == 4 and p.plan.runtime == "executor"]
    assert hosts and min(executor, key=lambda p: p.time_s).source == REPLICAS_SOURCE
    assert all(p.plan.runtime == "executor" for p in hosts)
    hsdp = [p for p in fr if p.source.startswith("hsdp")]
    assert hsdp and all(p.plan.runtime == "fsdp2" and p.plan.dp_replicate == 2 and p.plan.batch_size == 256
                        and [list(g) for g in p.plan.replicas] == [["h0g0"], ["h0g1"], ["h1g0"], ["h1g1"]]
                        for p in hsdp)
    for p in hosts:
        assert p.plan.num_replicas == 2 and p.plan.batch_size == 512 and p.num_devices == 2 * len(p.plan.devices)
        assert p.plan.replicas[1] == tuple(d.replace("h0", "h1") for d in p.plan.devices)
    for p in fr:    # every point, 1-D or 2-D: its simulated step and walked peak, on its own capture
        graph, costs = fr.inputs_for(p.plan, two_hosts.graph, two_hosts.costs)
        sim = simulate(p.plan, graph, costs, two_hosts.cluster)
        assert sim.time_s == p.time_s and sim.max_memory_bytes == p.memory_bytes
        assert set(sim.memory_bytes) == set(p.devices)
    assert any("data parallel across the hosts" in n for n in fr.notes)


def test_no_replicas_on_one_host_or_a_batch_the_hosts_do_not_divide():
    one = explore(Request(MLP, "preset:h100-hosts?hosts=1&gpus=2", algos=()))
    assert all(p.source != REPLICAS_SOURCE for p in one.frontier)
    odd = explore(Request(MLP, "preset:h100-hosts?hosts=3&gpus=1", algos=(), batch=1000))
    assert all(p.source != REPLICAS_SOURCE for p in odd.frontier)
    assert any("not a multiple of the 3 hosts" in n for n in odd.frontier.notes)


def test_tensoropt_simulate_takes_a_2d_plan_of_a_factory_and_says_its_step(two_hosts, tmp_path, capsys):
    # the factory builds the whole batch; the command captures one host's slice for the plan
    point = next(p for p in two_hosts.frontier if p.source == REPLICAS_SOURCE)
    point.plan.save(tmp_path / "plan.json")
    code, out, err = run_cli(capsys, "simulate", str(tmp_path / "plan.json"), MLP, "--cluster",
                             "preset:h100-hosts?hosts=2&gpus=2")
    assert code == 0, err
    assert f"simulated iteration time {point.time_s * 1e3:.3f} ms" in out
    assert f"{1024 / point.time_s:.1f} samples/s" in out     # both hosts' 512 samples


def test_no_replicas_where_a_hosts_slice_cannot_fit(two_hosts):
    # a budget some plan of the whole batch on all four GPUs fits, but not the model's state beside
    # what one host's slice of the batch must hold at once (the bound of planmodel/fits on the
    # slice's own capture): the 2-D plans are not searched, and the note says why
    from tensoropt.planmodel.fits import least_live_by_count, least_state_bytes

    fr = two_hosts.frontier
    point = next(p for p in fr if p.source == REPLICAS_SOURCE)
    part, costs = fr.inputs_for(point.plan, two_hosts.graph, two_hosts.costs)
    assert part.batch_size == 512
    request = Request(MLP, "preset:h100-hosts?hosts=2&gpus=2", algos=())
    bound = least_state_bytes(part, 2, "adamw") + request.reserve + least_live_by_count(part, costs, {2})[2].bytes
    least = min(p.memory_bytes for p in fr if p.source != REPLICAS_SOURCE)
    assert least < bound <= min(p.memory_bytes for p in fr if p.source == REPLICAS_SOURCE)
    budget = (least + bound) // 2
    tight = explore(Request(MLP, "preset:h100-hosts?hosts=2&gpus=2", algos=(), budget=budget)).frontier
    assert all(p.source != REPLICAS_SOURCE for p in tight) and any(p.memory_bytes <= budget for p in tight)
    assert any("not tried: no plan within one host can fit its slice of the batch (512 of 1024" in n
               for n in tight.notes)


def test_hsdp_degrees_the_hosts_cannot_take_are_named_in_a_note():
    # --dp-replicate 2,3 on four hosts: 2 groups of 2 hosts are priced (hsdp+tp, …: on this tiny Llama every
    # one is dominated by FSDP × TP or the search, so none joins), 3 does not divide the hosts and 4 would leave
    # FSDP one host a group: each refused degree named with its reason
    found = explore(Request("zoo:llama3-8b?tiny=1", "preset:h100-hosts?hosts=4&gpus=2", batch=8, algos=(),
                            dp_replicate=(2, 3, 4)))
    notes = [n for n in found.frontier.notes if "HSDP" in n]
    assert notes == ["HSDP with 3 replicate groups not tried: the 4 hosts are not a multiple of it",
                     "HSDP with 4 replicate groups not tried: the 4 hosts would leave FSDP one host a group, "
                     "nothing to shard over"]
    assert all(p.plan.dp_replicate == 2 for p in found.frontier if p.source.startswith("hsdp"))
