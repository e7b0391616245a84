"""Split-rule conformance over PyTorch's operator database: every split the profile offers, run
by the executor, against the unsplit op (:mod:`tensoropt.execute.conformance`).

    python benchmarks/split_rules.py [--ops add,linear] [--ci] [--max-samples N] [--jobs 2]
                                     [--variants float64-grad,float32-grad,float64,float32]
                                     [--markdown docs/split-rules.md] [-v]

For every OpInfo of ``torch.testing._internal.common_methods_invocations.op_db`` (it imports on
the CPU once ``expecttest`` is installed) whose op supports the variant's dtype on the CPU, every
sample input (``--max-samples N``: the first N) of each variant — float64 and float32, with
gradients (when the op supports autograd) and without — goes through
:func:`~tensoropt.execute.conformance.check_call`: captured as a one-op module with torch.export,
profiled at degrees 1, 2 and 3, and every (node, layout, degree) the profile offers run by the
executor and compared with the unsplit op (outputs, input and parameter gradients).

``--ci``: the ops the zoo and the real-model suite contain (:data:`MODEL_OPS`) plus a fixed
sample of the rest (every :data:`CI_EVERY`-th op of the database by name), with one op for the
ops one rule covers alike (:func:`rule_class`: the unary elementwise ops, whose rule reads no
argument of the op; a model op stands for them), two samples each, float64 with gradients,
fresh worker processes every :data:`CI_FRESH_EVERY` ops — what ``tests/execute/test_split_rules.py``
runs.

Prints one row per op (samples checked / not captured / unusable, splits tried per layout,
failures) then totals: ops covered, samples, (op, layout) pairs tried, passing, failing, and the
(op, layout) pairs the rules declare unsplittable (an op with no rule, or whose rule says its
batch / channel dimension is mixed by the op: ``tensoropt.capture.semantics``).  Exit status 1
when any offered split fails.  ``--jobs``: worker processes (one op at a time each, one thread).

It runs :func:`~tensoropt.execute.conformance.check_call` and reports: it must not decide what a
split rule is (``tensoropt.capture.semantics`` does).
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing as mp
import sys
import time
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import torch

from tensoropt.execute.conformance import check_call

VARIANTS = {"float64-grad": (torch.float64, True), "float32-grad": (torch.float32, True),
            "float64": (torch.float64, False), "float32": (torch.float32, False),
            "float64-grad-channels": (torch.float64, True)}
#: variants whose first input is given a channel dimension (each of its dimensions but the first,
#: in turn: :class:`tensoropt.execute.conformance.ChannelSource`) and only channel splits checked
CHANNEL_VARIANTS = {"float64-grad-channels"}
#: base names of the ATen ops the zoo and the real-model suite capture to (benchmarks/real_models.py),
#: which the CI subset always covers (OpInfo names differ: matched by :func:`_aten_bases`)
MODEL_OPS = ("__and__", "abs", "adaptive_avg_pool1d", "adaptive_avg_pool2d", "add", "addmm", "argmax", "avg_pool2d",
             "batch_norm", "bernoulli", "bmm", "cat", "chunk", "contiguous", "conv1d", "conv2d", "conv_transpose2d",
             "cos", "cumsum", "diff", "div", "dropout", "embedding", "eq", "expand", "flatten", "floor", "gather",
             "ge", "gelu", "group_norm", "gt", "hardtanh", "index", "layer_norm", "le", "linear", "log", "lstm",
             "lt", "masked_fill", "matmul", "max_pool2d", "mean", "min", "mul", "ne", "neg", "new_ones",
             "new_zeros", "pad", "permute", "pow", "relu", "reshape", "roll", "rsqrt", "scaled_dot_product_attention",
             "select", "select_scatter", "sigmoid", "silu", "sin", "slice_scatter", "softmax", "split", "squeeze",
             "stack", "sub", "sum", "tanh", "to", "transpose", "unsqueeze", "upsample_bilinear2d", "view", "where",
             "zeros_like", "full_like")
CI_EVERY = 8
#: --ci: ops per worker process before a fresh one (the whole database's run: 20); the CI subset's
#: ops on 2 workers would otherwise spend a third of their time importing torch and op_db again
CI_FRESH_EVERY = 100


@dataclass
class OpRow:
    """One OpInfo's result over the variants run."""

    name: str
    samples: int = 0
    not_captured: int = 0
    unusable: int = 0
    tried: Counter = field(default_factory=Counter)        # layout → splits run
    failed: Counter = field(default_factory=Counter)       # layout → splits failed
    failures: list = field(default_factory=list)           # (variant, node op, layout, degree, note)
    declared: set = field(default_factory=set)             # (node op, layout) the rules refuse
    pairs: set = field(default_factory=set)                # (node op, layout) offered and run
    ops: set = field(default_factory=set)                  # node ops seen
    seconds: float = 0.0
    error: str = ""


def _opinfo_name(op) -> str:
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


def _aten_bases(op) -> set[str]:
    names = {op.name.split(".")[-1], op.name.replace(".", "_")}
    for alias in getattr(op, "aliases", ()) or ():
        names.add(getattr(alias, "name", str(alias)).split(".")[-1])
    aten = getattr(op, "aten_name", None)
    if aten:
        names.add(aten)
    return names


def _overloads(op) -> list:
    """The ATen overloads named like the OpInfo (its ``aten_name``, else its name) that take a
    tensor first and are not ``out=`` forms: the ops a capture of it may record (``cos.float``,
    Python-number arithmetic, is not one); empty where no ATen op has its name (a composite of
    several ops: most ``nn.functional.*``)."""
    for name in dict.fromkeys(n for n in (getattr(op, "aten_name", None), op.name.split(".")[-1]) if n):
        packet = getattr(torch.ops.aten, name, None)
        if not isinstance(packet, torch._ops.OpOverloadPacket):
            continue
        found = [o for o in (getattr(packet, name) for name in packet.overloads())
                 if o._schema.arguments and str(o._schema.arguments[0].type) == "Tensor"
                 and not any(a.is_out for a in o._schema.arguments)]
        if found:
            return found
    return []


def rule_class(op) -> tuple | None:
    """The class of ops one rule covers alike, or None: an op that is its own case.

    A unary elementwise op — every overload it may record in the elementwise family
    (:func:`tensoropt.capture.semantics.batch_family`: torch's ``pointwise`` tag, copies) and
    taking one tensor — is ``("elementwise", 1)``: the rule reads no argument of the op (a batch
    split wherever the output has the batch, channels inherited from its input) and the executor
    cuts its one input and joins its pieces the same way for every such op.  Everything else is
    its own case: ops of the other families read their own dimensions, indices or weights; an
    elementwise op of several tensors broadcasts them or reads one as a weight (``prelu``), its
    own way; a random op draws keyed its own way; a composite of several ops has no one rule.
    """
    from tensoropt.capture.semantics import batch_family

    overloads = _overloads(op)
    if not overloads or any(batch_family(o) != "elementwise" or torch.Tag.nondeterministic_seeded in o.tags
                            or sum("Tensor" in str(a.type) for a in o._schema.arguments) != 1 for o in overloads):
        return None
    return ("elementwise", 1)


def select_ops(op_db, names: list[str] | None, ci: bool) -> list[int]:
    """Indices into ``op_db`` of the ops to run (``ci``: module docstring)."""
    if names:
        wanted = set(names)
        return [i for i, op in enumerate(op_db) if _opinfo_name(op) in wanted or op.name in wanted]
    if not ci:
        return list(range(len(op_db)))
    ordered = sorted(range(len(op_db)), key=lambda i: _opinfo_name(op_db[i]))
    sample = set(ordered[::CI_EVERY])
    model = {i for i, op in enumerate(op_db) if _aten_bases(op) & set(MODEL_OPS)}
    kept, classes = [], set()
    for i in sorted(model | sample, key=lambda i: (i not in model, _opinfo_name(op_db[i]))):   # model ops first
        c = rule_class(op_db[i])
        if c is None or c not in classes:
            kept.append(i)
            classes.add(c)
    return sorted(kept, key=lambda i: _opinfo_name(op_db[i]))


def run_op(index: int, variants: list[str], max_samples: int | None) -> OpRow:
    """Every sample of ``op_db[index]`` in every variant (run in a worker process)."""
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    torch.set_num_threads(1)
    # op_db: seconds to import, and it warns while loading: after the filters above, in the worker
    from torch.testing._internal.common_methods_invocations import op_db

    op = op_db[index]
    row = OpRow(_opinfo_name(op))
    t0 = time.perf_counter()
    try:
        supported = op.supported_dtypes("cpu")
        for variant in variants:
            dtype, grad = VARIANTS[variant]
            if dtype not in supported:
                continue
            grad = grad and op.supports_autograd
            if VARIANTS[variant][1] and not grad:
                continue        # the gradient variant of an op without autograd is its plain one
            for i, s in enumerate(op.sample_inputs("cpu", dtype, requires_grad=grad)):
                if max_samples is not None and i >= max_samples:
                    break
                calls = [dict()]
                if variant in CHANNEL_VARIANTS:
                    x = s.input
                    calls = [dict(channel_dim=d, layouts=("channel",)) for d in range(1, x.dim())
                             if x.shape[d] >= 2] if isinstance(x, torch.Tensor) else []
                for extra in calls:
                    _one(row, variant, op, s, grad, extra)
    except Exception as e:  # noqa: BLE001 - sample generation itself failed
        row.error = f"{type(e).__name__}: {str(e)[:200]}"
    row.seconds = time.perf_counter() - t0
    return row


def _one(row: OpRow, variant: str, op, s, grad: bool, extra: dict) -> None:
    """One call of :func:`check_call` on sample ``s``, added to ``row``."""
    try:
        r = check_call(op.op, (s.input, *s.args), s.kwargs, requires_grad=grad, name="op", **extra)
    except Exception as e:  # noqa: BLE001 - the harness itself failed: that is a failure too
        row.failures.append((variant, "?", "?", 0, f"harness: {type(e).__name__}: {str(e)[:200]}"))
        row.failed["?"] += 1
        return
    if r.status == "not-captured":
        row.not_captured += 1
        return
    if r.status == "failed":
        row.failures.append((variant, "?", "profile", 0, r.reason))
        row.failed["profile"] += 1
        return
    if r.status != "checked":
        row.unusable += 1
        return
    row.samples += 1
    row.ops.update(o for o in r.ops if o not in CHANNEL_SOURCE_OPS or "channel_dim" not in extra)
    row.declared.update(r.declared)
    for c in r.checks:
        row.tried[c.layout] += 1
        row.pairs.add((c.op, c.layout))
        if not c.passed:
            row.failed[c.layout] += 1
            row.failures.append((variant, c.op, c.layout, c.degree, c.note))


CHANNEL_SOURCE_OPS = {"aten.movedim.int", "aten.linear.default"}


def _task(args):
    return run_op(*args)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ops", help="comma-separated OpInfo names (default: the whole database)")
    ap.add_argument("--ci", action="store_true",
                    help="the CI subset: model ops + every 8th op, one unary elementwise op, 2 samples, float64")
    ap.add_argument("--max-samples", type=int, default=None)
    ap.add_argument("--variants", default=None, help=f"comma-separated, of {', '.join(VARIANTS)}")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--fresh-every", type=int, default=None,
                    help=f"ops per worker before a fresh one (default 20; --ci: {CI_FRESH_EVERY})")
    ap.add_argument("--markdown", help="also write the table to this markdown file")
    ap.add_argument("-v", "--verbose", action="store_true", help="every failure, not one per op")
    a = ap.parse_args(argv)
    # op_db takes seconds to import: only once the arguments are good (--help stays instant)
    from torch.testing._internal.common_methods_invocations import op_db

    variants = (a.variants.split(",") if a.variants else ["float64-grad"] if a.ci else list(VARIANTS))
    max_samples = a.max_samples if a.max_samples is not None else (2 if a.ci else None)
    indices = select_ops(op_db, a.ops.split(",") if a.ops else None, a.ci)
    t0 = time.perf_counter()
    fresh = a.fresh_every if a.fresh_every is not None else (CI_FRESH_EVERY if a.ci else 20)
    rows = run_all(indices, variants, max_samples, a.jobs, fresh)
    wall = time.perf_counter() - t0
    text = report(rows, variants, max_samples, wall, a.verbose)
    print(text)
    if a.markdown:
        command = "python benchmarks/split_rules.py " + " ".join(argv if argv is not None else sys.argv[1:])
        Path(a.markdown).write_text(DOC_HEAD.format(command=command.strip(), torch=torch.__version__) + text + "\n")
    return 1 if any(r.failures for r in rows) else 0


DOC_HEAD = """# Split rules against PyTorch's operator samples

Every split a plan may use is a rule: which argument of an op is cut along which dimension, and
what the pieces make.  A rule that is slightly wrong is a crash in the executor or, worse, a
plan that trains another function.  So every rule is checked on PyTorch's own sample inputs of
every operator (the OpInfo database, `torch.testing._internal.common_methods_invocations.op_db`)
as DTensor checks its sharding rules: each sample is captured as a one-op module through the
normal capture path (torch.export), profiled at degrees 1, 2 and 3 (3: uneven shards), and every
(node, layout, degree) the profile offers is run by the executor, alone, and compared with the
unsplit op — every output elementwise and every input and parameter gradient, at the check's
tolerances (`tensoropt/execute/conformance.py`).  What the profiler measured must be what the
executor runs: an offered split the executor would run whole, or a measured shard whose output
bytes differ from the executor's largest shard, fails too.

An op tensoropt has no rule for is replicated (never split); `tensoropt graph` lists such ops
with their modules.  "Declared unsplittable" below are the (op, layout) pairs whose output has a
batch dimension in its shapes that the rules refuse (the op mixes samples along it, or has no
rule).  The variants: `float64-grad` / `float32-grad` (gradients compared), `float64` /
`float32` (forward only), `float64-grad-channels` (the first input given a channel dimension,
each of its dimensions but the first in turn, by a linear layer before the op, and the op's
channel splits checked).  Not captured: torch.export refuses the call (data-dependent shapes,
in-place writes into an input): no graph, so no plan, holds it.  Unusable: the op refuses its
own sample, returns no floating tensor, draws random numbers the executor cannot key, or takes
sparse / complex tensors.

Made with `{command}` (torch {torch}, CPU, 2 worker processes).

"""


def run_all(indices: list[int], variants: list[str], max_samples: int | None, jobs: int,
            fresh_every: int = 20) -> list[OpRow]:
    """:func:`run_op` over ``indices`` in ``jobs`` worker processes (fresh ones every
    ``fresh_every`` ops)."""
    tasks = [(i, variants, max_samples) for i in indices]
    if jobs <= 1:
        return [run_op(*t) for t in tasks]
    with mp.get_context("spawn").Pool(jobs, maxtasksperchild=fresh_every) as pool:
        return list(pool.imap(_task, tasks))


def report(rows: list[OpRow], variants: list[str], max_samples: int | None, wall: float, verbose: bool) -> str:
    layouts = ("batch", "channel", "reduce")
    lines = [f"variants: {', '.join(variants)}; samples per op and variant: {max_samples or 'all'}; "
             f"{len(rows)} ops; {wall:.0f} s", "",
             "| op | samples | not captured | unusable | " + " | ".join(f"{lay} tried / failed" for lay in layouts)
             + " | declared unsplittable |",
             "|---|---:|---:|---:|" + "---:|" * len(layouts) + "---|"]
    for r in rows:
        if not (r.samples or r.not_captured or r.unusable or r.error):
            continue
        cells = [f"{r.tried[lay]} / {r.failed[lay]}" if r.tried[lay] else "–" for lay in layouts]
        declared = ", ".join(sorted(f"{o.split('.')[1] if o.startswith('aten.') else o} {lay}"
                                    for o, lay in r.declared)) or ""
        lines.append(f"| {r.name} | {r.samples} | {r.not_captured} | {r.unusable} | " + " | ".join(cells)
                     + f" | {declared} |")
    covered = [r for r in rows if r.samples]
    pairs_tried = {p for r in rows for p in r.pairs}
    pairs_failed = {(f[1], f[2]) for r in rows for f in r.failures}
    declared = {p for r in rows for p in r.declared}
    lines += ["", f"- ops covered (at least one sample captured and checked): {len(covered)} of {len(rows)}",
              f"- samples checked: {sum(r.samples for r in rows)}; not captured by torch.export: "
              f"{sum(r.not_captured for r in rows)}; unusable (the op refuses its own sample, or returns no "
              f"floating tensor, or draws randomly without a key): {sum(r.unusable for r in rows)}",
              f"- splits run: {sum(sum(r.tried.values()) for r in rows)} "
              f"({', '.join(f'{lay} {sum(r.tried[lay] for r in rows)}' for lay in layouts)}); failed: "
              f"{sum(sum(r.failed.values()) for r in rows)}",
              f"- (node op, layout) pairs offered and run: {len(pairs_tried)}; passing on every sample: "
              f"{len(pairs_tried - pairs_failed)}; with a failure: {len(pairs_failed)}",
              f"- (node op, layout) pairs declared unsplittable where the shapes alone would allow a batch "
              f"split: {len(declared)}"]
    failing = [r for r in rows if r.failures]
    if failing:
        lines += ["", "Failures:"]
        for r in failing:
            shown = r.failures if verbose else r.failures[:1]
            for v, o, lay, k, note in shown:
                lines.append(f"- {r.name} [{v}] {o} {lay}×{k}: {note}")
            if not verbose and len(r.failures) > 1:
                lines.append(f"  (and {len(r.failures) - 1} more)")
    errors = [r for r in rows if r.error]
    if errors:
        lines += ["", "Sample generation failed:"] + [f"- {r.name}: {r.error}" for r in errors]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
