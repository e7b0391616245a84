"""Link benchmark: the least-squares fit, real gloo transfers between two processes, the gloo
collectives, the written cluster YAML and the ``bench-links`` command."""

from __future__ import annotations

import contextlib
import io
import math

import numpy as np
import pytest
import torch

from tensoropt.cluster.bench import CollectiveSample, _run_gloo, bench_links, measure_collectives
from tensoropt.cluster.linkfit import MIN_DUPLEX, BenchError, LinkFit, fit_duplex, fit_link
from tensoropt.errors import ClusterSpecError, TensorOptError

KiB, MiB = 1 << 10, 1 << 20
SIZES = [4 * KiB * 4 ** k for k in range(8)]          # 4 KiB … 64 MiB


# ------------------------------------------------------------------------------------------- fit

@pytest.mark.parametrize("weighting", ["relative", "none"])
def test_fit_recovers_an_exact_line(weighting):
    latency, bandwidth = 37e-6, 12.5e9
    times = [latency + s / bandwidth for s in SIZES]
    f = fit_link(SIZES, times, weighting=weighting)
    assert f.latency_s == pytest.approx(latency, rel=1e-9)
    assert f.bandwidth_Bps == pytest.approx(bandwidth, rel=1e-9)
    assert f.r2 == pytest.approx(1.0, abs=1e-12)
    assert f.n == len(SIZES)
    assert f.time(1 << 20) == pytest.approx(latency + (1 << 20) / bandwidth, rel=1e-9)


def test_fit_with_noise_has_r2_below_one_and_stays_close():
    rng = np.random.default_rng(0)
    latency, bandwidth = 200e-6, 3e9
    exact = np.array([latency + s / bandwidth for s in SIZES])
    noisy = exact * (1 + rng.normal(0, 0.05, exact.size))
    f = fit_link(SIZES, noisy)
    assert 0.9 < f.r2 < 1.0
    assert f.bandwidth_Bps == pytest.approx(bandwidth, rel=0.15)
    assert f.latency_s == pytest.approx(latency, rel=0.25)


def test_fit_negative_intercept_becomes_zero_latency():
    # pure bandwidth plus a bit less time for the small sizes: the free intercept would be < 0
    times = [s / 2e9 for s in SIZES]
    times[0] *= 0.9
    f = fit_link(SIZES, times)
    assert f.latency_s == 0.0
    assert f.bandwidth_Bps == pytest.approx(2e9, rel=0.05)


def test_degenerate_fit_names_the_pair_and_the_fix():
    # times that fall with the size (noise swamping tiny transfers): no bandwidth
    with pytest.raises(BenchError) as e:
        fit_link([1024, 2048, 4096], [3e-4, 2e-4, 1e-4], pair=("cpu0", "cpu1"))
    msg = str(e.value)
    assert "cpu0 → cpu1" in msg and "--max-size" in msg and "bandwidth" in msg
    assert isinstance(e.value, ClusterSpecError) and isinstance(e.value, TensorOptError)
    with pytest.raises(BenchError, match="cpu2 → cpu3"):                  # flat: slope 0
        fit_link([1024, 4096], [1e-4, 1e-4], pair=("cpu2", "cpu3"))
    with pytest.raises(BenchError, match="two distinct sizes"):
        fit_link([4096, 4096], [1e-4, 2e-4])
    with pytest.raises(BenchError, match="finite"):
        fit_link([1024, 4096], [1e-4, float("nan")])


def test_linkfit_is_a_link_model():
    from tensoropt.cluster import LinkModel

    f = LinkFit(latency_s=1e-5, bandwidth_Bps=1e10, r2=1.0, n=2)
    link = f.link
    assert isinstance(link, LinkModel)
    assert link.time(1e6) == pytest.approx(f.time(1e6))
    assert f.duplex == 1.0 and link.duplex == 1.0
    half = LinkFit(latency_s=1e-5, bandwidth_Bps=1e10, r2=1.0, n=2, duplex=0.5)
    assert half.link == LinkModel(1e-5, 1e10, 0.5)
    assert half.link.time_both_ways(1e6) == pytest.approx(half.time_both_ways(1e6)) == pytest.approx(1e-5 + 2e-4)


def test_fit_duplex_recovers_the_model_and_clamps():
    latency, bandwidth = 50e-6, 2e9
    sizes = [MiB, 4 * MiB, 16 * MiB]
    for duplex in (1.0, 0.5, 0.37):
        exchange = [latency + s / (bandwidth * duplex) for s in sizes]
        assert fit_duplex(latency, bandwidth, sizes, exchange) == pytest.approx(duplex, rel=1e-12)
    # ratio of sums: the largest size weighs most
    exchange = [latency + s / bandwidth * k for s, k in zip(sizes, (10, 2, 2))]
    assert fit_duplex(latency, bandwidth, sizes, exchange) == pytest.approx(21 / (10 + 8 + 32))
    # an exchange as fast as one way (or faster: noise) is full duplex; absurdly slow is clamped
    assert fit_duplex(latency, bandwidth, sizes, [latency + s / bandwidth * 0.9 for s in sizes]) == 1.0
    assert fit_duplex(latency, bandwidth, [MiB], [latency / 2]) == 1.0
    assert fit_duplex(latency, bandwidth, [MiB], [1e3]) == MIN_DUPLEX
    with pytest.raises(BenchError, match="as many exchange times as sizes"):
        fit_duplex(latency, bandwidth, [MiB, 2 * MiB], [1e-3])
    with pytest.raises(BenchError, match="finite"):
        fit_duplex(latency, bandwidth, [MiB], [float("inf")])


# ------------------------------------------------------------------------------------ real gloo

@pytest.fixture(scope="module")
def gloo_run(tmp_path_factory):
    """One real sweep shared by the tests below (every gloo run starts processes that import torch:
    seconds each): ``tensoropt bench-links -o`` with 2 processes, 4 sizes 256 KiB … 16 MiB (the
    largest takes ten milliseconds or more, so the slope stands out of the scheduling noise of a
    loaded 2-core machine: with 64 KiB … 4 MiB a CI run beside the other xdist worker once fitted a
    negative slope); the BenchResult the command got from bench_links is kept too.

    The recording function replaces the name the command calls (``tensoropt.cli.bench_links``
    binds ``bench_links`` when it is imported): patching ``tensoropt.cluster.bench`` instead
    recorded nothing whenever an earlier test in the same process had run ``tensoropt.cli.main``
    (it imports every command module) — the three errors seen under pytest-xdist, whose workers
    run other tests first.  The command's exit code and output are asserted before the result
    is read, so a failed measurement says why."""
    from tensoropt.cli import bench_links as command
    from tensoropt.cli import main

    got = []

    def recording(**kw):
        got.append(bench_links(**kw))
        return got[-1]

    out = tmp_path_factory.mktemp("bench") / "c.yaml"
    argv = ["bench-links", "--backend", "gloo", "--world-size", "2", "--min-size", "256KiB", "--max-size", "16MiB",
            "--repeats", "5", "--warmup", "1", "--samples", "--name", "loopback", "-o", str(out)]
    with (pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(io.StringIO()) as text,
          contextlib.redirect_stderr(io.StringIO()) as err):
        mp.setattr(command, "bench_links", recording)
        rc = main(argv)
    assert rc == 0, f"tensoropt {' '.join(argv)} exited {rc}:\n{err.getvalue()}{text.getvalue()}"
    assert len(got) == 1, f"the command did not call the recording bench_links ({len(got)} calls)"
    return rc, text.getvalue(), out, got[0]


@pytest.fixture(scope="module")
def gloo_result(gloo_run):
    return gloo_run[3]


def test_gloo_sweep_fits_every_ordered_pair(gloo_result):
    r = gloo_result
    assert r.backend == "gloo" and r.devices == ("cpu0", "cpu1")
    assert set(r.fits) == {("cpu0", "cpu1"), ("cpu1", "cpu0")}
    for pair, f in r.fits.items():
        assert f.bandwidth_Bps > 0 and math.isfinite(f.bandwidth_Bps)
        assert f.latency_s >= 0 and f.n == 4
        assert set(r.samples[pair]) == {256 * KiB, MiB, 4 * MiB, 16 * MiB}     # 256 KiB, ×4 … 16 MiB
        assert all(t > 0 for t in r.samples[pair].values())
        assert all(len(ts) == 5 for ts in r.raw[pair].values())
        # the simultaneous exchange at the three largest sizes gives the duplex
        assert set(r.exchange[pair]) == {MiB, 4 * MiB, 16 * MiB}
        assert all(t > 0 for t in r.exchange[pair].values())
        assert all(len(ts) == 5 for ts in r.exchange_raw[pair].values())
        assert MIN_DUPLEX <= f.duplex <= 1.0
        assert f.duplex == fit_duplex(f.latency_s, f.bandwidth_Bps, list(r.exchange[pair]),
                                      list(r.exchange[pair].values()))
    assert r.exchange[("cpu0", "cpu1")] == r.exchange[("cpu1", "cpu0")]     # one exchange, both directions
    assert r.exchange_sizes == [MiB, 4 * MiB, 16 * MiB]
    assert r.memory_bytes["cpu0"] > 0


def test_gloo_result_round_trips_through_yaml(gloo_result, tmp_path):
    from tensoropt.cluster import Cluster

    c = gloo_result.cluster(name="loopback")
    path = tmp_path / "bench.yaml"
    c.save(path)
    back = Cluster.load(path)
    assert back == c and back.name == "loopback"
    assert list(back.names) == ["cpu0", "cpu1"]
    for (src, dst), f in gloo_result.fits.items():
        link = back.link(src, dst)
        assert link.latency_s == f.latency_s          # exact: the YAML units round-trip floats
        assert link.bandwidth_Bps == f.bandwidth_Bps
        assert link.duplex == f.duplex
    assert "duplex from simultaneous exchanges of 1 MiB, 4 MiB, 16 MiB" in c.source
    one = gloo_result.cluster(memory_bytes=8 << 30)
    assert all(d.memory_bytes == 8 << 30 for d in one.devices)


def test_busy_ranks_before_each_round_trip_are_recorded():
    r = bench_links(backend="gloo", world_size=2, sizes=[256 * KiB, 64 * MiB], repeats=5, warmup=1, busy_s=0.001)
    assert r.extra["busy_s"] == 0.001 and "busy 1 ms before each round trip" in r.method
    assert set(r.fits) == {("cpu0", "cpu1"), ("cpu1", "cpu0")}


def test_collectives_on_two_processes():
    samples = measure_collectives(world_size=2, sizes=[64 * KiB], repeats=3, warmup=1, timeout_s=60)
    assert {s.collective for s in samples} == {"all_reduce", "all_gather", "reduce_scatter", "all_to_all",
                                               "broadcast"}
    for s in samples:
        assert isinstance(s, CollectiveSample)
        assert s.world_size == 2 and s.nbytes == 64 * KiB
        assert s.supported, f"{s.collective}: {s.note}"      # torch 2.13's gloo has all five
        assert s.median_s > 0 and len(s.samples) == 3 and s.api


def test_bad_options_are_clear_errors():
    with pytest.raises(BenchError, match="world_size"):
        bench_links(backend="gloo", world_size=1)
    with pytest.raises(BenchError, match="two distinct sizes"):
        bench_links(backend="gloo", sizes=[4096])
    with pytest.raises(BenchError, match="unknown backend"):
        bench_links(backend="nccl")
    with pytest.raises(BenchError, match="busy time"):
        bench_links(backend="gloo", busy_s=-1)
    if torch.cuda.device_count() < 2:
        with pytest.raises(BenchError, match="at least 2 GPUs"):
            bench_links(backend="cuda")


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="the CUDA link benchmark needs at least 2 GPUs; "
                                                           f"torch sees {torch.cuda.device_count()}")
def test_cuda_copies_between_gpus():
    r = bench_links(backend="cuda", sizes=[64 * KiB, MiB, 16 * MiB], repeats=5)
    n = torch.cuda.device_count()
    assert len(r.fits) == n * (n - 1)
    assert all(f.bandwidth_Bps > 0 for f in r.fits.values())
    assert r.memory_bytes["gpu0"] == torch.cuda.get_device_properties(0).total_memory


# ------------------------------------------------------------------------------------------ CLI

def test_cli_bench_links_writes_a_loadable_cluster(gloo_run):
    from tensoropt.cluster import Cluster

    rc, text, out, result = gloo_run
    assert rc == 0, text
    assert "cpu0" in text and "GB/s" in text and "R²" in text and f"wrote {out}" in text
    assert "256KiB" in text and "16MiB" in text         # --samples: one row per size
    assert "duplex" in text and "cpu0 ⇄ cpu1" in text and "cpu1 ⇄ cpu0" not in text   # duplex, exchange table
    c = Cluster.load(out)
    assert c.name == "loopback" and set(c.names) == {"cpu0", "cpu1"}
    assert c.link("cpu0", "cpu1").bandwidth_Bps > 0
    assert c == result.cluster(name="loopback")       # the file holds exactly what was measured


def test_cli_rejects_bad_sizes(capsys):
    from tensoropt.cli import main

    with pytest.raises(SystemExit):
        main(["bench-links", "--max-size", "12 parsecs"])
    assert "unknown size unit" in capsys.readouterr().err
    assert main(["bench-links", "--min-size", "1MiB", "--max-size", "64KiB"]) == 2
    assert "larger than --max-size" in capsys.readouterr().err


def test_a_vanished_worker_is_a_clear_error():
    with pytest.raises(BenchError, match="rank 1 of 2 died with exit code 3"):
        _run_gloo(2, "selftest", {"mode": "exit"}, timeout_s=20, total=1, report=lambda *a: None, what="test")


def test_a_hung_worker_times_out():
    # rank 1 sleeps; rank 0 waits in a barrier until gloo's timeout (2 s) and reports that, with
    # its traceback (the path every error raised inside a worker takes).  That it is gloo's
    # timeout, not the parent's own limit (1.25 × 2 + 5 s plus a minute's start-up allowance),
    # is in the message: the parent's says "no word from the gloo workers" instead
    with pytest.raises(BenchError, match=r"test: gloo worker rank 0 of 2 failed: .*(?i:timed? ?out)") as e:
        _run_gloo(2, "selftest", {"mode": "hang"}, timeout_s=2, total=1, report=lambda *a: None, what="test")
    assert "Traceback" in str(e.value) or "File " in str(e.value)
    assert "no word from the gloo workers" not in str(e.value)
