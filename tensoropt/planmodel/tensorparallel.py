"""Which of PyTorch's tensor-parallel styles express a plan: module path → style, read off the plan's
data flow (:func:`tensor_parallel_modules`).  One set of rules for the two stages that need them:
the tp placers price a plan as PyTorch's DTensor runs it (runtime ``dtensor``) exactly where these
styles express it, and ``tensoropt export`` writes ``parallelize_module`` with them
(:mod:`tensoropt.export.expressible`, :mod:`tensoropt.export.tpstyles` for the PyTorch objects).

It owns the rules; it must not build PyTorch's styles (no torch here) nor price a plan.
"""

from __future__ import annotations

from ..errors import TensorOptError
from ..graph import OpGraph
from ..plan import Plan
from .reshard import op_basename
from .wrappers import fsdp_across_replicas

__all__ = ["TP_STYLES", "tensor_parallel_modules", "price_as_dtensor"]


#: PyTorch's tensor-parallel styles (:mod:`tensoropt.export.tpstyles`) by the layout of a linear
TP_STYLES = {"channel": "colwise", "reduce": "rowwise"}


def tensor_parallel_modules(graph: OpGraph, plan: Plan) -> dict[str, str]:
    """The ``parallelize_module`` plan that runs ``plan`` — Megatron's tensor parallelism over all
    its devices, with or without sequence parallelism — as PyTorch's DTensor runs it: module path →
    a style of :mod:`tensoropt.export.tpstyles`.  A linear cutting its output features (layout
    ``channel``) is ``colwise``; one cutting its input features (``reduce``) ``rowwise``, or ``rowwise_sequence``
    where its partial sums go to operators on the rows of tokens (``batch``: reduce-scattered).  A
    module whose every operator runs on rows (a norm under sequence parallelism) is ``sequence``,
    ``sequence_gathered`` where column layers read its output, ``sequence_whole`` where whole
    operators do; a module whose whole output only rows read is ``to_sequence``; a module that
    reads rows whole as its first input ``from_sequence``.  Every other operator runs as the model
    wrote it, on whatever its module gets: whole where the plan keeps it whole (``R``), on the
    rank's piece where it follows a column layer (``channel``) or lies on the rows (``batch``: the
    residual adds).

    Expressible when every operator runs on all the plan's devices, no sharding level, no pipeline
    stages (micro-batches are a loop around the step), no replicas but FSDP2's over them (runtime
    ``fsdp2``: this is the plan of each replica's tp axis); each cut operator with a weight is a
    ``linear`` of its own module, read once; a column layer reads a whole input (or a gathered
    module's), a cut value flows from it only to followers and to row layers (never to a whole
    reader: PyTorch hands the local piece on, where the plan would gather it), and a row layer reads
    it split along its last dimension; an operator on rows that reads a parameter lies in a module
    all on rows, which reads one value from outside; rows pass between modules only through the
    styles above.  Else a :class:`~tensoropt.errors.TensorOptError` naming the first operator that
    is not and why.  O(V + E).

    Example (a block of two linears on two devices: the first column, the ReLU split, the second row)::

        >>> import torch
        >>> from tensoropt import capture, load_cluster, price, profile, place
        >>> block = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8))
        >>> graph = capture(torch.nn.Sequential(block), (torch.randn(4, 8),))
        >>> priced = price(profile(graph, shard_degrees=(1, 2), timed=False, cache=False),
        ...                load_cluster("preset:a100-4-nvlink"))
        >>> tensor_parallel_modules(graph, place(graph, priced.costs, priced.cluster, "tp", devices=["gpu0", "gpu1"]))
        {'0.0': 'colwise', '0.2': 'rowwise'}
    """
    devices = tuple(plan.devices)
    # (micro-batches are a loop around the step: they change no module's style)
    whole_plan = (f"{plan.num_replicas} replicas" if plan.replicas and not fsdp_across_replicas(plan) else
                  "pipeline stages" if plan.pipeline is not None else "one device" if len(devices) < 2 else None)
    if whole_plan:
        raise TensorOptError(f"the plan runs {whole_plan}: PyTorch's tensor parallelism expresses a plan whose every "
                             "operator runs on all its devices")

    def refuse(name: str, why: str) -> TensorOptError:
        node = graph.nodes[name]
        return TensorOptError(f"operator {name!r} ({node.op} in {node.module_path or 'the model'!r}) {why}: "
                              "PyTorch's tensor-parallel styles do not express it (tensoropt's executor runs it)")

    layout = {n: str(c.layout) for n, c in plan.configs.items()}

    def last_dim_cut(name: str) -> bool:   # its output's channels are its last dimension
        out = graph.nodes[name].outputs
        return bool(out) and out[0].channel_dim == len(out[0].shape) - 1

    def has_channels(name: str) -> bool:
        out = graph.nodes[name].outputs
        return bool(out) and out[0].channel_dim is not None

    def readers(name: str) -> list[str]:
        return [j for j in graph.successors(name) if j in layout]

    members: dict[str, list[str]] = {}   # module → its operators and its submodules', in order
    for name in plan.order:
        path = graph.nodes[name].module_path
        while path:
            members.setdefault(path, []).append(name)
            path = path.rpartition(".")[0]

    def exits(module: str) -> list[str]:   # its operators read from outside it
        inside = set(members[module])
        return [n for n in members[module] if any(j not in inside for j in readers(n)) and not _alias(graph, n)]

    # each operator's trainable parameters, which both passes below ask
    weights = {n: [q for q in (*graph.nodes[n].params, *graph.nodes[n].param_reads) if graph.params[q].is_trainable]
               for n in plan.order}
    modules: dict[str, str] = {}

    def give(module: str, style: str, name: str) -> None:
        if modules.get(module, style) != style:
            raise refuse(name, f"needs module {module!r} to be {style}, but it is {modules[module]} already")
        modules[module] = style

    for name in plan.order:
        cfg, node = plan.configs[name], graph.nodes[name]
        if tuple(cfg.devices) != devices:
            raise refuse(name, f"runs on {', '.join(cfg.devices)}, not on every device of the plan")
        if cfg.shard:
            raise refuse(name, f"shards its parameters (level {int(cfg.shard)})")
        # on rows, an operator reading a parameter must lie in a module all on rows (below)
        if layout[name] in ("R", "batch") or (not weights[name] and layout[name] == "channel"):
            continue
        if op_basename(node.op) != "linear" or weights[name][:1] != [f"{node.module_path}.weight"]:
            raise refuse(name, f"cuts its weights ({layout[name]}) but is not a linear layer of its own module")
        if node.module_path in modules:
            raise refuse(name, f"is a second call of module {node.module_path!r}")
        modules[node.module_path] = TP_STYLES[layout[name]]
    if "colwise" not in modules.values():
        raise TensorOptError("the plan cuts no linear layer by its output features (it "
                             + ("splits the batch only: data parallelism" if "batch" in layout.values() else
                                "keeps every layer whole") + "), so there is no tensor parallelism to express")
    # sequence parallelism: the modules all on rows, and how rows cross module boundaries
    on_rows = {m for m, ops in members.items() if all(layout[n] == "batch" for n in ops)}
    for name in plan.order:
        node = graph.nodes[name]
        if layout[name] != "batch":
            continue
        home = next((m for m in _outermost_first(node.module_path) if m in on_rows), None)
        if any(graph.nodes[p].kind == "input" for p in node.inputs if p in graph.nodes):
            raise refuse(name, "reads the model's input on rows (every rank is handed the whole batch)")
        if weights[name] and home is None:
            raise refuse(name, "runs on rows and reads a parameter outside a module all on rows (SequenceParallel "
                               "replicates a module's parameters and sums their gradients)")
        if home is not None and name == members[home][0]:
            inside = set(members[home])
            outside = {p for n in members[home] for p in graph.nodes[n].inputs if p in layout and p not in inside}
            if len(outside) > 1:
                raise refuse(name, f"opens module {home!r} on rows, which reads {len(outside)} values from outside "
                                   "(SequenceParallel cuts its first input)")
            out = exits(home)
            if len(out) != 1:
                raise refuse(name, f"opens module {home!r} on rows, whose output is not one value")
            after = [j for j in readers(out[0]) if j not in inside]
            kinds = {"rows" if layout[j] == "batch" else
                     "column" if modules.get(graph.nodes[j].module_path) == "colwise"
                     and op_basename(graph.nodes[j].op) == "linear" else "whole" for j in after}
            if len(kinds) > 1 and "rows" in kinds:
                raise refuse(out[0], "is read both on rows and whole")
            give(home, "sequence" if kinds <= {"rows"} else "sequence_gathered" if kinds == {"column"}
                 else "sequence_whole", name)
    gathered = {exits(m)[0] for m, style in modules.items() if style in ("sequence_gathered", "sequence_whole")}
    for name in plan.order:
        node = graph.nodes[name]
        style = modules.get(node.module_path) if op_basename(node.op) == "linear" else None
        ins = [i for i in node.inputs if i in layout]
        if style == "colwise" and any(layout[i] != "R" and i not in gathered for i in ins):
            raise refuse(name, "is column parallel but reads a value already cut")
        if style == "rowwise" and any(layout[i] != "channel" or not last_dim_cut(i) for i in ins):
            raise refuse(name, "is row parallel but reads a value not cut along its last dimension")
        if layout[name] == "channel":
            for j in readers(name):
                if layout[j] == "R":
                    raise refuse(j, f"reads {name!r} whole where the plan cuts it (PyTorch would hand it the piece)")
            if style is None and any(layout[i] == "R" and has_channels(i) for i in ins):
                raise refuse(name, "reads a whole value the plan cuts for it")
        if style == "rowwise" and readers(name) and all(layout[j] == "batch" for j in readers(name)):
            modules[node.module_path] = "rowwise_sequence"
        elif style == "rowwise" and any(layout[j] == "batch" for j in readers(name)):
            raise refuse(name, "hands its partial sums both to rows and to whole readers")
        for i in ins:
            if layout[name] == "batch" and layout[i] == "R":
                # a whole value cut to rows: the output of its module, read only on rows
                src = graph.nodes[i].module_path
                if not src or exits(src) != [i] or any(layout[j] != "batch" for j in readers(i)):
                    raise refuse(name, f"reads {i!r} on rows, which is not the one output of a module read only on "
                                       "rows (PrepareModuleOutput cuts a module's output)")
                give(src, "to_sequence", name)
            elif layout[name] in ("R", "channel") and layout[i] == "batch" and i not in gathered:
                # rows gathered whole as the first input of the reader's module
                dst = node.module_path
                if not dst or dst in on_rows or members[dst][0] != name or layout[name] == "channel" and style:
                    raise refuse(name, f"reads {i!r} whole from rows, not as the first input of a module of its own "
                                       "(PrepareModuleInput gathers a module's input)")
                give(dst, "from_sequence", name)
            elif layout[name] == "batch" and layout[i] == "channel":
                raise refuse(name, f"reads {i!r} on rows, which is cut by channels")
    return modules


def _alias(graph: OpGraph, name: str) -> bool:
    """Whether operator ``name`` hands on its input unchanged (a ``to`` to the dtype it has: the
    capture names the result, the model's code reads the same tensor, e.g. a norm's residual)."""
    node = graph.nodes[name]
    src = graph.nodes.get(node.inputs[0]) if len(node.inputs) == 1 else None
    return (op_basename(node.op) in ("to", "_to_copy") and src is not None and bool(src.outputs)
            and src.outputs[:1] == node.outputs[:1])


def _outermost_first(path: str) -> list[str]:
    """``"a.b.c"`` → ``["a", "a.b", "a.b.c"]``."""
    parts = path.split(".") if path else []
    return [".".join(parts[:k]) for k in range(1, len(parts) + 1)]


def price_as_dtensor(plan: Plan, graph: OpGraph) -> Plan:
    """``plan`` (a tensor-parallel placer's, priced as tensoropt's executor runs it so far) priced as
    PyTorch's DTensor runs it (runtime ``dtensor``) where :func:`tensor_parallel_modules` expresses
    it — what ``tensoropt export`` then writes — else left to the executor; a note says which.
    Changes and returns ``plan``."""
    try:
        modules = tensor_parallel_modules(graph, plan)
    except TensorOptError as e:
        plan.notes.append(f"priced as tensoropt's executor runs it: tensoropt export runs it there, not on PyTorch's "
                          f"tensor parallelism ({e})")
        return plan
    plan.options["runtime"] = "dtensor"
    plan.notes.append(f"priced as PyTorch's tensor parallelism runs it (parallelize_module on {len(modules)} modules, "
                      "each parameter's .grad made at its backward) — tensoropt export writes it so")
    return plan
