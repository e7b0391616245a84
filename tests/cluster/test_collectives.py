"""Collective costs from pair links: hand-computed values on a small cluster, and properties."""

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tensoropt.cluster import (
    Cluster,
    Device,
    LinkModel,
    all_to_all_time,
    allgather_time,
    backend_reduce_scatter_time,
    broadcast_time,
    p2p_time,
    reduce_scatter_time,
    ring_allreduce_time,
)
from tensoropt.errors import ClusterSpecError

FAST = LinkModel(1e-6, 10e9)      # 1 us, 10 GB/s
SLOW = LinkModel(1e-5, 1e9)       # 10 us, 1 GB/s


def tri(symmetric=True):
    """a, b, c: every link fast except c → a (and a → c when symmetric)."""
    links = {("c", "a"): SLOW}
    if symmetric:
        links[("a", "c")] = SLOW
    return Cluster("tri", [Device(n, 2**30) for n in "abc"], links, default=FAST)


# 3 MB over 3 devices: 1 MB chunks; fast chunk 1 us + 100 us, slow chunk 10 us + 1000 us
N = 3_000_000
FAST_CHUNK = 1e-6 + 1e-4
SLOW_CHUNK = 1e-5 + 1e-3


def test_hand_computed_values_on_three_devices():
    c = tri()
    ring = ["a", "b", "c"]                                          # ring a→b→c→a uses the slow c→a
    assert p2p_time(c, "a", "c", N) == pytest.approx(1e-5 + 3e-3)
    assert ring_allreduce_time(c, ring, N) == pytest.approx(4 * SLOW_CHUNK)   # 2(n-1) steps, slow-bound
    assert allgather_time(c, ring, N) == pytest.approx(2 * SLOW_CHUNK)
    assert reduce_scatter_time(c, ring, N) == pytest.approx(2 * SLOW_CHUNK)
    # pairwise all-to-all: round 1 a→b, b→c, c→a; round 2 a→c, b→a, c→b; each has a slow link
    assert all_to_all_time(c, ring, N) == pytest.approx(2 * SLOW_CHUNK)
    # chain a→b→c never touches the slow link; chain a→c→b does
    assert broadcast_time(c, ["a", "b", "c"], N) == pytest.approx(2e-6 + N / 10e9)
    assert broadcast_time(c, ["a", "c", "b"], N) == pytest.approx(1e-5 + 1e-6 + N / 1e9)


def test_hand_computed_values_with_duplex():
    # every link: 100 us, 2 GB/s one way, 0.4 of that each way when both directions carry traffic
    shared = LinkModel(1e-4, 2e9, 0.4)
    c = Cluster("loop", [Device(n, 2**30) for n in "abc"], {}, default=shared)
    both = lambda b: 1e-4 + b / 0.8e9                                      # noqa: E731  2 GB/s × 0.4
    one = lambda b: 1e-4 + b / 2e9                                         # noqa: E731
    pair, ring = ["a", "b"], ["a", "b", "c"]
    assert p2p_time(c, "a", "b", N) == pytest.approx(one(N))                # one direction: no sharing
    # two devices: every step is an exchange of half the tensor
    assert all_to_all_time(c, pair, N) == pytest.approx(both(N / 2))
    assert allgather_time(c, pair, N) == pytest.approx(both(N / 2))
    assert reduce_scatter_time(c, pair, N) == pytest.approx(both(N / 2))
    assert ring_allreduce_time(c, pair, N) == pytest.approx(2 * both(N / 2))
    assert broadcast_time(c, pair, N) == pytest.approx(one(N))              # nobody sends back
    # three devices: each device sends to its successor while it receives from its predecessor
    assert ring_allreduce_time(c, ring, N) == pytest.approx(4 * both(N / 3))
    assert allgather_time(c, ring, N) == pytest.approx(2 * both(N / 3))
    assert all_to_all_time(c, ring, N) == pytest.approx(2 * both(N / 3))
    # the chain a → b → c: b relays (receives and sends at once), so the stream runs at 0.8 GB/s
    assert broadcast_time(c, ring, N) == pytest.approx(2e-4 + N / 0.8e9)
    # a full-duplex link in the ring does not help: the slowest (shared) link bounds each step
    mixed = c.with_links({("a", "b"): FAST, ("b", "c"): FAST})
    assert allgather_time(mixed, ring, N) == pytest.approx(2 * both(N / 3))
    full = Cluster("full", c.devices, {}, default=LinkModel(1e-4, 2e9))
    assert allgather_time(full, ring, N) == pytest.approx(2 * one(N / 3))


def test_pytorch_s_reduce_scatter_on_cpu_ranks_is_gloo_s_all_reduce_and_nccl_s_ring_on_gpus():
    # gloo's reduce_scatter_tensor all-reduces the whole input (ProcessGroupGloo): 2 (n-1) steps of
    # N / n at 0.8 GB/s on three CPU ranks; NCCL's ring on GPUs is (n-1) of them
    shared = LinkModel(1e-4, 2e9, 0.4)
    step = 1e-4 + N / 3 / 0.8e9
    cpus = Cluster("cpus", [Device(n, 2**30, kind="cpu") for n in "abc"], {}, default=shared)
    gpus = Cluster("gpus", [Device(n, 2**30, kind="NVIDIA H100 80GB HBM3") for n in "abc"], {}, default=shared)
    assert backend_reduce_scatter_time(cpus, ["a", "b", "c"], N) == pytest.approx(4 * step)
    assert backend_reduce_scatter_time(gpus, ["a", "b", "c"], N) == pytest.approx(2 * step)
    assert Device("x", 1, kind=" CPU ").is_cpu and not Device("x", 1).is_cpu


def test_ring_direction_matters_on_an_asymmetric_link():
    c = tri(symmetric=False)                                        # only c → a is slow
    assert ring_allreduce_time(c, ["a", "b", "c"], N) == pytest.approx(4 * SLOW_CHUNK)
    assert ring_allreduce_time(c, ["a", "c", "b"], N) == pytest.approx(4 * FAST_CHUNK)   # a→c→b→a: all fast


def test_single_device_and_zero_bytes_cost_nothing():
    c = tri()
    for fn in (ring_allreduce_time, allgather_time, reduce_scatter_time, all_to_all_time, broadcast_time):
        assert fn(c, ["b"], N) == 0.0
        assert fn(c, ["a", "b", "c"], 0) == 0.0
    assert p2p_time(c, "a", "a", N) == 0.0


def test_two_devices_reduce_to_point_to_point():
    c = tri()
    assert broadcast_time(c, ["a", "b"], N) == pytest.approx(p2p_time(c, "a", "b", N))
    assert allgather_time(c, ["a", "b"], N) == pytest.approx(p2p_time(c, "a", "b", N / 2))
    assert all_to_all_time(c, ["a", "c"], N) == pytest.approx(p2p_time(c, "a", "c", N / 2))


def test_bad_groups():
    c = tri()
    with pytest.raises(ValueError, match="distinct"):
        ring_allreduce_time(c, ["a", "a"], N)
    with pytest.raises(ValueError, match="at least one device"):
        allgather_time(c, [], N)
    with pytest.raises(ValueError, match="nbytes"):
        all_to_all_time(c, ["a", "b"], -1)
    with pytest.raises(ClusterSpecError, match="no device 'z'"):
        broadcast_time(c, ["a", "z"], N)


# ---- properties over random clusters --------------------------------------------------------------

_link = st.builds(LinkModel, st.floats(0, 1e-4), st.floats(1e8, 1e11), st.sampled_from([1.0, 1.0, 0.5, 0.3]))


@st.composite
def groups(draw):
    n = draw(st.integers(1, 6))
    names = [f"g{i}" for i in range(n)]
    links = {(a, b): draw(_link) for a, b in itertools.permutations(names, 2)}
    c = Cluster("rand", [Device(x, 2**30) for x in names], links)
    order = draw(st.permutations(names))
    return c, list(order)


COLLECTIVES = (ring_allreduce_time, allgather_time, reduce_scatter_time, all_to_all_time, broadcast_time)


@settings(max_examples=80, deadline=None)
@given(groups(), st.floats(0, 1e10), st.floats(0, 1e10))
def test_more_bytes_never_take_less_time(cg, x, y):
    c, order = cg
    lo, hi = sorted((x, y))
    for fn in COLLECTIVES:
        assert fn(c, order, lo) <= fn(c, order, hi) * (1 + 1e-12)
        assert fn(c, order, hi) >= 0


@settings(max_examples=80, deadline=None)
@given(groups(), st.floats(1, 1e10))
def test_allreduce_is_reduce_scatter_plus_allgather(cg, nbytes):
    c, order = cg
    rs_ag = reduce_scatter_time(c, order, nbytes) + allgather_time(c, order, nbytes)
    assert ring_allreduce_time(c, order, nbytes) == pytest.approx(rs_ag, rel=1e-12)


@settings(max_examples=60, deadline=None)
@given(groups(), st.floats(1, 1e10), st.integers(0, 5))
def test_ring_cost_does_not_depend_on_where_the_ring_starts(cg, nbytes, k):
    c, order = cg
    k %= len(order)
    rotated = order[k:] + order[:k]
    assert ring_allreduce_time(c, rotated, nbytes) == pytest.approx(ring_allreduce_time(c, order, nbytes))
    assert all_to_all_time(c, rotated, nbytes) == pytest.approx(all_to_all_time(c, order, nbytes))


@settings(max_examples=60, deadline=None)
@given(groups(), st.floats(1, 1e10))
def test_a_collective_is_at_least_its_slowest_chunk_transfer(cg, nbytes):
    c, order = cg
    n = len(order)
    if n > 1:
        ring = [c.link(order[i], order[(i + 1) % n]).time(nbytes / n) for i in range(n)]
        assert allgather_time(c, order, nbytes) >= max(ring) * (n - 1) * (1 - 1e-12)
        slowest_any = max(c.link(a, b).time(nbytes / n) for a, b in itertools.permutations(order, 2))
        assert all_to_all_time(c, order, nbytes) >= slowest_any * (1 - 1e-12)
        # sharing the bandwidth never makes a collective faster than its full-duplex twin
        full = c.with_links({p: LinkModel(ln.latency_s, ln.bandwidth_Bps) for p, ln in c.links.items()})
        for fn in COLLECTIVES:
            assert fn(c, order, nbytes) >= fn(full, order, nbytes) * (1 - 1e-12)


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 7), st.randoms(use_true_random=False), st.lists(st.floats(1.0, 1e10), min_size=1, max_size=5))
def test_a_ring_step_is_its_slowest_link_whatever_the_size(n, rnd, chunks):
    # links of random latency, exchange latency, bandwidth and duplex (few distinct values: ties);
    # the ring's bottlenecks give, at every size, the slowest link found by going round every one
    names = [f"d{i}" for i in range(n)]
    pick = lambda xs: xs[rnd.randrange(len(xs))]   # noqa: E731
    links = {(a, b): LinkModel(pick([1e-6, 5e-6, 2e-5]), pick([1e9, 5e9, 2.5e10]), pick([0.5, 1.0]),
                               pick([None, 3e-5]))
             for a in names for b in names if a != b}
    c = Cluster("random", [Device(x, 2**30) for x in names], links)
    ring = names[:]
    rnd.shuffle(ring)
    ring = ring[:rnd.randrange(2, n + 1)]
    around = [c.link(ring[i], ring[(i + 1) % len(ring)]) for i in range(len(ring))]
    kept = c.ring_bottlenecks(ring)
    assert set(kept) <= set(around) and kept[0].bandwidth_Bps * kept[0].duplex == min(
        x.bandwidth_Bps * x.duplex for x in around)
    for chunk in chunks:
        assert max(x.time_both_ways(chunk) for x in kept) == max(x.time_both_ways(chunk) for x in around)
    with pytest.raises(ValueError, match="distinct"):
        c.ring_bottlenecks([names[0], names[1], names[0]])
    with pytest.raises(ClusterSpecError):
        c.ring_bottlenecks([names[0], "nowhere"])
    # an all-to-all's rounds, the same way: its time is the formula's sum over every link of each round
    for chunk in chunks:
        m = len(ring)
        formula = sum(max(c.link(ring[i], ring[(i + r) % m]).time_both_ways(chunk / m) for i in range(m))
                      for r in range(1, m))
        assert all_to_all_time(c, ring, chunk) == formula
    with pytest.raises(ValueError, match="distinct"):
        c.exchange_rounds([names[0], names[1], names[0]])
