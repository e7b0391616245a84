"""Collective communication costs derived from the pair links of the devices involved.

Every function takes a :class:`~tensoropt.cluster.spec.Cluster`, an ordered group of device names
and a byte count, and returns seconds.  Shared assumptions:

- a link moves bytes one way at its ``bandwidth``; while traffic also flows the other way it
  keeps ``duplex`` of that (:meth:`LinkModel.time_both_ways`).  Counted per device: a transfer
  whose sender is also receiving, or whose receiver is also sending, at the same moment runs at
  ``bandwidth · duplex``.  That covers both directions of one link (an exchange, a ring of two)
  and a device receiving on one link while it sends on another (ring steps with n ≥ 3,
  all-to-all rounds, the relays of a pipelined chain): where duplex < 1 comes from (TCP over
  loopback or one NIC, both directions copied by the same CPU cores) a device's sending and
  receiving share it whichever links they use.  Point-to-point transfers, and a broadcast
  between two devices, use the one-way ``bandwidth``.  Links with ``duplex = 1`` (NVLink, PCIe DMA,
  every preset and NVML discovery) are full duplex, and nothing changes for them;
- a step in which several links carry a message each ends when the slowest of them finishes, so
  the slowest link of a ring bounds the whole ring;
- no contention with computation and no sharing of a physical link between two logical pairs
  (PCIe switches and NICs shared by several GPUs make real collectives slower: measure with
  ``tensoropt bench-links``);
- a group of one device, or zero bytes, costs 0.

Chunks are ``nbytes / n`` (not rounded to whole bytes or elements).  Ring-based functions are
O(n); :func:`all_to_all_time` is O(n²).

It must not measure: the costs are formulas over the cluster's pair links
(:mod:`tensoropt.cluster.bench` measures the real collectives to check them).
"""

from __future__ import annotations

from collections.abc import Sequence

from .spec import Cluster, LinkModel


def _group(cluster: Cluster, devices: Sequence[str], nbytes: int | float) -> tuple[str, ...]:
    devices = tuple(devices)
    if not devices:
        raise ValueError("a collective needs at least one device")
    if len(devices) > 1:
        cluster.ring_bottlenecks(devices)   # checked there once a ring: distinct, the cluster's
    else:
        cluster.device(devices[0])          # unknown names → ClusterSpecError naming the cluster's devices
    if nbytes < 0:
        raise ValueError(f"nbytes must be >= 0, got {nbytes}")
    return devices


def _ring_step(links: Sequence[LinkModel], chunk: float) -> float:
    """One ring step: every link moves ``chunk`` bytes at once, and every device sends to its
    successor while it receives from its predecessor, so each transfer runs at
    ``bandwidth · duplex`` (``time_both_ways``); the slowest finishes last."""
    return max(link.time_both_ways(chunk) for link in links)


def p2p_time(cluster: Cluster, src: str, dst: str, nbytes: int | float) -> float:
    """Seconds to send ``nbytes`` from ``src`` to ``dst``: ``latency + nbytes / bandwidth`` of that
    directed link, one direction only (0 when ``src == dst`` or ``nbytes == 0``)."""
    if nbytes < 0:
        raise ValueError(f"nbytes must be >= 0, got {nbytes}")
    return cluster.link(src, dst).time(nbytes)


def ring_allreduce_bytes_time(cluster: Cluster, devices: Sequence[str], nbytes: int | float) -> float:
    """The bandwidth part of :func:`ring_allreduce_time` alone, no latencies::

        T = 2 (n-1) · max over ring links ((nbytes / n) / (bandwidth · duplex))

    What one tensor adds to an all-reduce that carries many in one bucket (the bucket pays the
    latencies once)."""
    devices = _group(cluster, devices, nbytes)
    n = len(devices)
    if n == 1 or nbytes == 0:
        return 0.0
    return 2 * (n - 1) * max((nbytes / n) / (link.bandwidth_Bps * link.duplex)
                             for link in cluster.ring_bottlenecks(devices))


def ring_allreduce_time(cluster: Cluster, devices: Sequence[str], nbytes: int | float) -> float:
    """Ring all-reduce of a tensor of ``nbytes`` held (in full) by each of the n devices.

    ``2 (n-1)`` steps (n-1 of reduce-scatter, n-1 of all-gather), each moving ``nbytes / n`` over
    every link of the ring in the given order at once; every device sends and receives in every
    step, so each link runs at ``bandwidth · duplex``::

        T = 2 (n-1) · max over ring links (latency + (nbytes / n) / (bandwidth · duplex))

    Equals ``reduce_scatter_time + allgather_time`` of the same tensor.
    """
    devices = _group(cluster, devices, nbytes)
    n = len(devices)
    if n == 1:
        return 0.0
    return 2 * (n - 1) * _ring_step(cluster.ring_bottlenecks(devices), nbytes / n)


def allgather_time(cluster: Cluster, devices: Sequence[str], nbytes: int | float) -> float:
    """Ring all-gather; ``nbytes`` is the size of the FULL gathered tensor (each device starts with
    ``nbytes / n``); every device sends and receives in each step::

        T = (n-1) · max over ring links (latency + (nbytes / n) / (bandwidth · duplex))
    """
    devices = _group(cluster, devices, nbytes)
    n = len(devices)
    if n == 1:
        return 0.0
    return (n - 1) * _ring_step(cluster.ring_bottlenecks(devices), nbytes / n)


def reduce_scatter_time(cluster: Cluster, devices: Sequence[str], nbytes: int | float) -> float:
    """Ring reduce-scatter; ``nbytes`` is the size of the full input on each device (each ends with
    a reduced ``nbytes / n`` shard).  Same traffic as :func:`allgather_time`, in reverse::

        T = (n-1) · max over ring links (latency + (nbytes / n) / (bandwidth · duplex))

    (The reduction's arithmetic is not counted: it is memory-bound and overlaps the transfers.)
    This is the ring algorithm NCCL uses; gloo (torch's CPU backend) runs ``reduce_scatter_tensor``
    as a full all-reduce plus a copy: :func:`backend_reduce_scatter_time` prices that.
    """
    return allgather_time(cluster, devices, nbytes)


def backend_reduce_scatter_time(cluster: Cluster, devices: Sequence[str], nbytes: int | float) -> float:
    """PyTorch's ``reduce_scatter_tensor`` (what FSDP2 calls) on the backend of the devices:
    NCCL's ring on GPUs (:func:`reduce_scatter_time`); on CPU ranks (every device's
    :attr:`~.spec.Device.is_cpu`) gloo's, which all-reduces the whole input and copies this rank's
    piece out — :func:`ring_allreduce_time`, twice the ring's traffic.  Measured on two gloo ranks
    over loopback (``benchmarks/links.py``, 16 MiB): 32.7 ms, the ring formula 72 % under it, the
    all-reduce's 45 % (gloo's copies through temporaries are not counted)."""
    devices = _group(cluster, devices, nbytes)
    if all(cluster.device(d).is_cpu for d in devices):
        return ring_allreduce_time(cluster, devices, nbytes)
    return reduce_scatter_time(cluster, devices, nbytes)


def all_to_all_time(cluster: Cluster, devices: Sequence[str], nbytes: int | float) -> float:
    """All-to-all; ``nbytes`` is each device's buffer, of which it sends ``nbytes / n`` to every other
    device (``nbytes (n-1) / n`` in all) and keeps its own share.

    Pairwise schedule: ``n-1`` rounds; in round r (1 ≤ r < n) device i sends to device
    ``(i + r) mod n`` while it receives from ``(i - r) mod n`` (so every link runs both ways:
    ``bandwidth · duplex``), and a round ends with its slowest transfer::

        T = Σ_{r=1}^{n-1} max_i (latency(i → i+r) + (nbytes / n) / (bandwidth(i → i+r) · duplex(i → i+r)))
    """
    devices = _group(cluster, devices, nbytes)
    n = len(devices)
    if n == 1:
        return 0.0
    chunk = nbytes / n
    # each round's slowest among the links that can be (Cluster.exchange_rounds): the same max
    return sum(_ring_step(links, chunk) for links in cluster.exchange_rounds(devices))


def broadcast_time(cluster: Cluster, devices: Sequence[str], nbytes: int | float) -> float:
    """Broadcast ``nbytes`` from ``devices[0]`` to the others, pipelined along the chain
    ``d0 → d1 → … → d(n-1)`` (NCCL's ring broadcast, without the closing link).

    With fine-grained pipelining the data streams at the slowest chain link's bandwidth and the
    chain's latencies add up once.  Each link carries one direction only, but with three or more
    devices every link has a relay at one end (``d1 … d(n-2)`` receive from their predecessor
    while they send to their successor), so — as in a ring step — the chain links run at
    ``bandwidth · duplex``::

        T = Σ chain latencies + nbytes / min over chain links (bandwidth · duplex)    (n ≥ 3)

    For two devices this is :func:`p2p_time` (one direction, no relay, duplex not applied).
    Chunking overhead is ignored, so this is a lower bound for small messages on long chains.
    gloo (torch's CPU backend) broadcasts along a binomial tree instead: ``ceil(log2 n)`` rounds
    of a full-message point-to-point (``benchmarks/links.py`` shows both).
    """
    devices = _group(cluster, devices, nbytes)
    n = len(devices)
    if n == 1 or nbytes == 0:
        return 0.0
    chain = [cluster.link(devices[i], devices[i + 1]) for i in range(n - 1)]
    if n == 2:
        return chain[0].time(nbytes)
    return sum(link.latency_s for link in chain) + nbytes / min(link.bandwidth_Bps * link.duplex for link in chain)
