"""``tensoropt cluster``: show a cluster (preset or file), detect this machine's GPUs, list presets.

It owns the ``cluster`` subcommands and how a cluster is printed; reading, detecting and the
presets are :mod:`tensoropt.cluster`'s: it must not measure links (``bench-links`` does).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

from rich.console import Console, JustifyMethod
from rich.markup import escape
from rich.table import Table

from ..cluster import PRESETS, Cluster, LinkModel, detect_cluster, get_preset, load_cluster
from ..cluster.units import fmt_size
from ._common import save_output


def _num(x: float) -> str:
    """A short number for matrix cells: 13, 12.5, 3.125, 0.05."""
    if math.isinf(x):
        return "inf"
    return f"{x:.4g}"


def _print_devices(cluster: Cluster, console: Console) -> None:
    """One row per device: name, kind, host, memory, speed."""
    devices = Table(title=f"cluster {escape(cluster.name)}: {len(cluster.devices)} device(s)", title_justify="left")
    columns: tuple[tuple[str, JustifyMethod], ...] = (("name", "left"), ("kind", "left"), ("host", "left"),
                                                      ("memory", "right"), ("speed", "right"))
    for col, justify in columns:
        devices.add_column(col, justify=justify)
    for d in cluster.devices:
        devices.add_row(escape(d.name), escape(d.kind or "-"), escape(d.host or "-"), fmt_size(d.memory_bytes),
                        _num(d.speed))
    console.print(devices)


def _print_link_matrices(cluster: Cluster, console: Console) -> None:
    """Bandwidth and latency (and duplex, where any link is not full duplex) per ordered pair."""
    matrices: list[tuple[str, Callable[[LinkModel], str]]] = [
        ("link bandwidth, GB/s (row → column)", lambda ln: _num(ln.bandwidth_Bps / 1e9)),
        ("link latency, us (row → column)", lambda ln: _num(ln.latency_s * 1e6))]
    if any(ln.duplex != 1.0 for ln in cluster.links.values()):
        matrices.append(("link duplex (row → column)", lambda ln: _num(ln.duplex)))
    for title, cell in matrices:
        m = Table(title=title, title_justify="left")
        m.add_column("from \\ to")
        for n in cluster.names:
            m.add_column(escape(n), justify="right")
        for a in cluster.names:
            m.add_row(escape(a), *("-" if a == b else cell(cluster.link(a, b)) for b in cluster.names))
        console.print(m)


def print_cluster(cluster: Cluster, console: Console) -> None:
    """Devices, then bandwidth and latency matrices (rows send, columns receive), then the fingerprint."""
    _print_devices(cluster, console)
    if len(cluster.devices) > 1:
        _print_link_matrices(cluster, console)
    console.print(f"fingerprint {cluster.fingerprint}", highlight=False)


def _cmd_show(args: argparse.Namespace, console: Console) -> int:
    cluster = load_cluster(args.cluster)
    if args.yaml:
        console.out(cluster.to_yaml(), end="", highlight=False)
    else:
        print_cluster(cluster, console)
    return 0


def _cmd_detect(args: argparse.Namespace, console: Console) -> int:
    cluster = detect_cluster(args.name)
    print_cluster(cluster, console)
    console.print("links are nominal figures for the topology NVML reports; "
                  "measure the real ones with tensoropt bench-links", highlight=False)
    save_output(console, cluster, args.output)
    return 0


def _cmd_presets(args: argparse.Namespace, console: Console) -> int:
    t = Table(title="cluster presets (use as preset:NAME)", title_justify="left")
    for col in ("name", "devices", "memory", "description"):
        t.add_column(col, justify="right" if col == "devices" else "left")
    for name, (description, _) in PRESETS.items():
        c = get_preset(name)
        mems = sorted({d.memory_bytes for d in c.devices})
        t.add_row(name, str(len(c.devices)), ", ".join(fmt_size(m) for m in mems), escape(description))
    console.print(t)
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    c = sub.add_parser("cluster", help="show, detect or list clusters (devices and links)",
                       description="Clusters are given as preset:NAME or a YAML / JSON file "
                                   "(see `tensoropt cluster presets`).")
    csub = c.add_subparsers(dest="cluster_command", metavar="SUBCOMMAND")
    csub.required = True

    show = csub.add_parser("show", help="print a cluster's devices, link matrices and fingerprint")
    show.add_argument("cluster", metavar="CLUSTER", help="preset:NAME or a cluster .yaml / .json file")
    show.add_argument("--yaml", action="store_true", help="print the cluster as YAML (a file to edit) instead")
    show.set_defaults(func=_cmd_show)

    detect = csub.add_parser("detect", help="describe this machine's NVIDIA GPUs through NVML (nominal links)")
    detect.add_argument("-o", "--output", metavar="OUT", help="also write the cluster to OUT (.yaml or .json)")
    detect.add_argument("--name", default="local", help="cluster name (default: local)")
    detect.set_defaults(func=_cmd_detect)

    presets = csub.add_parser("presets", help="list the built-in clusters")
    presets.set_defaults(func=_cmd_presets)
