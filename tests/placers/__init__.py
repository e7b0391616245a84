"""Placer tests: hand-built graphs whose placements can be worked out by hand, and the tiny zoo
models (fixtures in conftest.py).  Helpers shared by the test modules live here."""

from tensoropt.cluster import Cluster, Device, LinkModel
from tensoropt.graph import OpGraph, OpNode, ParamInfo, SplitDims, TensorMeta
from tensoropt.measure import CostModel, NodeCost, ShardCost

# every link: 0.5 s + bytes / (1000 B/s): 1000 bytes take exactly 1.5 s; all numbers are exact in binary
LINK = LinkModel(0.5, 1000.0)
GiB = 2**30


def cluster(n=2, memory=GiB, link=LINK, names=None):
    """``n`` devices ``g0 … g{n-1}`` (or ``names``) with ``memory`` bytes each (an int, or one per
    device) and the same link between every pair."""
    names = list(names or [f"g{i}" for i in range(n)])
    mems = memory if isinstance(memory, (list, tuple)) else [memory] * len(names)
    return Cluster("hand", [Device(nm, m) for nm, m in zip(names, mems)], {}, default=link)


def meta(nbytes):
    assert nbytes % 8 == 0
    return TensorMeta((2, nbytes // 8), "float32", 0, 1)


def build(ops, outputs=None, inputs=(("x", 400),), batch_size=2):
    """A graph and its costs by hand.  ``ops``: dicts with name, inputs, and optionally out (bytes,
    default 1000), fp / bp (seconds, default 1 / 0), params (bytes of one trainable parameter it
    owns), reads (names of parameters it reads), extra (bytes kept for backward), op, meta
    (metadata-only), gen (generator), batch (split.batch, default 0), shards.  ``batch_size``: the
    graph's (a batch split needs at least as many samples as devices).

    A node's resident memory under SGD is 2 × params + extra (parameter + gradient + kept bytes).
    """
    nodes = [OpNode(name, "input", kind="input", outputs=(meta(b),)) for name, b in inputs]
    out_bytes = dict(inputs)
    params, costs = {}, {}
    readers = {}
    for o in ops:
        for p in o.get("reads", ()):
            readers.setdefault(p, []).append(o["name"])
    for o in ops:
        out = o.get("out", 1000)
        out_bytes[o["name"]] = out
        pnames = ()
        if o.get("params"):
            pnames = (f"{o['name']}.w",)
            params[pnames[0]] = ParamInfo(pnames[0], (o["params"] // 4,), "float32", "parameter", True, o["name"],
                                          tuple(readers.get(pnames[0], ())))
        op = o.get("op", "aten.relu.default")
        free = o.get("meta", False)
        nodes.append(OpNode(o["name"], op, inputs=tuple(o["inputs"]),
                            input_bytes=tuple(out_bytes[i] for i in o["inputs"]), outputs=(meta(out),),
                            params=pnames, param_reads=tuple(o.get("reads", ())),
                            split=SplitDims(batch=o.get("batch", 0), channel=1), metadata_only=free,
                            generator=o.get("gen", False)))
        fp, bp = (0.0, 0.0) if free else (o.get("fp", 1.0), o.get("bp", 0.0))
        costs[o["name"]] = NodeCost(o["name"], op, fp, bp, "free" if free else "measured",
                                    param_bytes=o.get("params", 0), output_bytes=0 if free else out,
                                    saved_bytes=o.get("extra", 0), extra_saved_bytes=o.get("extra", 0),
                                    shards=o.get("shards", {}))
    last = [o["name"] for o in ops][-1:]
    outs = list(outputs if outputs is not None else last)
    nodes.append(OpNode("output", "output", kind="output", inputs=tuple(outs),
                        input_bytes=tuple(out_bytes[o] for o in outs)))
    g = OpGraph(nodes, params, name="hand", batch_size=batch_size)
    return g, CostModel(costs, graph_fingerprint=g.fingerprint, graph_name="hand", batch_size=batch_size,
                        settings={"shard_degrees": [1, 2]})


def batch2(fp=1.0, bp=0.0, out=1000):
    """The ("batch", 2) shard of a node: half the time and the output."""
    return {("batch", 2): ShardCost(fp / 2, bp / 2, out // 2, 0, 0)}


def placement(plan):
    """node -> its one device."""
    return {n: c.devices[0] for n, c in plan.configs.items()}


def on(plan, device):
    return sorted(n for n, c in plan.configs.items() if c.devices == (device,))


def spread_on_small_devices(graph, costs, algo, devices):
    """Place with ``algo`` on devices that hold about half of what the model needs each: every
    device must stay within its memory and everything must be placed, on at least two devices.
    Returns the small cluster and the plan."""
    from tensoropt.placers import place
    from tensoropt.placers._common import setup

    prob = setup(graph, costs, cluster(len(devices), names=devices), algo, devices=devices)
    need = sum(prob.group_bytes)
    small = cluster(len(devices), memory=max(max(prob.group_bytes), need // 2), names=devices)
    plan = place(graph, costs, small, algo)
    mem = plan.estimate(algo).memory_bytes
    assert len(mem) >= 2 and all(b <= small.device(d).memory_bytes for d, b in mem.items())
    assert sum(mem.values()) == need
    return small, plan
