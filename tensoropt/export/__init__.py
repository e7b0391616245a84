"""Plans you can launch: a plan exported as a directory that ``torchrun`` runs.

``tensoropt export PLAN MODEL --to torchrun -o DIR`` (:func:`export_plan`) writes

- ``train.py``, the entry torchrun starts: it builds the user's model from their factory (the
  same model spec, seeded), and applies the plan with PyTorch's own APIs wherever they express
  it — ``DistributedDataParallel`` for data parallelism, ``ZeroRedundancyOptimizer`` for ZeRO-1,
  ``fully_shard`` (FSDP2) on a ``DeviceMesh`` for ZeRO-2 / ZeRO-3, activation ``checkpoint`` where
  the plan recomputes whole modules — and otherwise (operators cut over devices, placed on some
  of them, mixing the batch's samples) runs the plan through tensoropt's executor; every step
  prints ``step K loss X``;
- ``plan.json``, the plan;
- ``README.md``: the exact ``torchrun --nnodes … --nproc-per-node …`` line, the plan's predicted
  per-device memory and step time (its simulator's estimate, :mod:`tensoropt.planmodel.simulate`,
  as ``tensoropt simulate -o`` records it), which path runs it and why, and the operators that need
  the executor.

The decision is :mod:`.expressible` (read its docstring for the rules), the files' text
:mod:`.render`, the executor's loop :mod:`.executor`.  Bad input (an output directory that is
not empty, a plan made for another model, a saved graph instead of a model) is a
:class:`~tensoropt.errors.TensorOptError` and nothing is written; the directory appears whole
or not at all (written beside it, then renamed).

Example (the data-parallel plan of a small model, exported; then, in the directory,
``torchrun --standalone --nproc-per-node 2 train.py`` prints ``step 1 loss 0.0211…`` …)::

    >>> from tensoropt import load_cluster, load_model, place, price, profile
    >>> graph = load_model("zoo:rnnlm?tiny=1").capture()
    >>> priced = price(profile(graph, timed=False), load_cluster("preset:a100-4-nvlink"))
    >>> place(graph, priced.costs, priced.cluster, "dp", devices=["gpu0", "gpu1"]).save("plan.json")
    >>> done = export_plan("plan.json", "zoo:rnnlm?tiny=1", "run_dp", steps=3)
    >>> done.expression.path, done.torchrun
    ('ddp', 'torchrun --nnodes 1 --nproc-per-node 2 train.py')
    >>> sorted(p.name for p in done.directory.iterdir())
    ['README.md', 'plan.json', 'train.py']

The same from the command line: ``tensoropt export plan.json zoo:rnnlm?tiny=1 --to torchrun -o
run_dp``.

Owns: the export's order (load, check, decide, write atomically).  Must not: run the plan.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..cluster import Cluster, load_cluster
from ..devicemodel import costs_source, price
from ..errors import ModelSpecError, TensorOptError
from ..execute.runplan import LocalBackend, load_for_run, load_plan
from ..graph import Precision
from ..measure.profiler import profile
from ..measure.step import plan_optimizer
from ..plan import Plan
from ..planmodel.pipelined import PipelineEstimate, price_plan, recipe_of
from ..planmodel.wrappers import fsdp_across_replicas
from .expressible import PATH_TITLES, Expression, LaunchShape, express, launch_shape
from .pipelined import pipeline_readme, pipeline_train_script
from .render import LOSS_LINE, OPTIMIZER_CODE, readme, train_script

#: what ``--to`` may name
TARGETS = ("torchrun",)

__all__ = ["TARGETS", "LOSS_LINE", "Exported", "Expression", "LaunchShape", "export_pipeline", "export_pipeline_plan",
           "export_plan", "express", "launch_shape"]


@dataclass(frozen=True)
class Exported:
    """What :func:`export_plan` wrote: the directory, the path the plan takes and how to start it."""

    directory: Path
    expression: Expression
    shape: LaunchShape

    @property
    def torchrun(self) -> str:
        return self.shape.torchrun("train.py")


def absolute_spec(spec: str) -> str:
    """``path/file.py:factory`` with the file's absolute path (the script runs from anywhere); a
    ``zoo:`` spec as it is; a saved graph or ONNX file is refused (no torch model to train)."""
    spec = spec.strip()
    if spec.startswith("zoo:"):
        return spec
    if spec.endswith((".json", ".onnx")):
        raise ModelSpecError(f"{spec} is a saved graph or ONNX file: an exported plan trains the torch model "
                             "(zoo:NAME or file.py:factory)")
    path, sep, factory = spec.rpartition(".py:")
    if not sep:
        return spec     # load_model names what is wrong with it
    return f"{Path(path + '.py').resolve()}:{factory}"


def _check_output(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise TensorOptError(f"{out} exists and is not an empty directory: give -o a new (or empty) directory")
    if not out.parent.exists():
        raise TensorOptError(f"{out.parent} does not exist: create it, or give -o a directory in an existing one")


def _check_optimizer(optimizer: str, what: str) -> None:
    """An optimizer ``train.py`` cannot build (:data:`~.render.OPTIMIZER_CODE`) is refused, naming those it can."""
    if optimizer not in OPTIMIZER_CODE:
        raise TensorOptError(f"{what} {optimizer!r} has no PyTorch counterpart here; use one of "
                             f"{', '.join(OPTIMIZER_CODE)}")


def _cluster_for(plan: Plan, cluster: str | Cluster | None) -> Cluster | None:
    """The cluster given, else the preset the plan names where its fingerprint is the plan's."""
    if cluster is not None:
        return load_cluster(cluster)
    if not plan.cluster_name:
        return None
    try:
        found = load_cluster(f"preset:{plan.cluster_name}")
    except TensorOptError:
        return None
    return found if found.fingerprint == plan.cluster_fingerprint else None


def export_plan(plan_path: str | os.PathLike, spec: str, out: str | os.PathLike, *, to: str = "torchrun",
                steps: int = 10, lr: float = 1e-3, seed: int = 0, batch: int | None = None,
                precision: str | None = None, cluster: str | Cluster | None = None) -> Exported:
    """Export the plan at ``plan_path`` for the model ``spec`` into the new directory ``out``
    (module docstring): ``steps`` / ``lr`` / ``seed`` the script's defaults, ``batch`` and
    ``precision`` as the plan was made with, ``cluster`` the cluster the plan was made for (its
    hosts give torchrun's ``--nnodes``; default: the preset the plan names, else one host).
    Raises :class:`~tensoropt.errors.TensorOptError` on bad input, with nothing written."""
    if to not in TARGETS:
        raise TensorOptError(f"cannot export to {to!r}: the targets are {', '.join(TARGETS)}")
    if steps < 0:
        raise TensorOptError("--steps must be ≥ 0")
    if lr <= 0:
        raise TensorOptError("--lr must be positive")
    out = Path(out)
    _check_output(out)
    spec = absolute_spec(spec)
    saved = Plan.load(plan_path)
    if saved.pipeline is not None:
        raise TensorOptError(f"{plan_path} is a pipeline plan: export it with export_pipeline_plan (the CLI's "
                             "tensoropt export does)")
    if saved.replicas and not fsdp_across_replicas(saved):
        raise TensorOptError(f"{plan_path} runs {saved.num_replicas} replicas (data parallel across hosts), which "
                             "export does not write yet: run it with tensoropt's executor, one process per device "
                             f"(torchrun --nproc-per-node … -m tensoropt.cli run MODEL --plan {plan_path} "
                             f"--backend dist, over {saved.num_devices} processes in all)")
    if batch is None and spec.startswith("zoo:") and saved.batch_size:
        # the batch the plan was made for, as `tensoropt simulate` takes it (every replica's slice of it)
        batch = saved.global_batch_size
    # captured at the first replica's micro-batch (the whole batch for a plan of neither)
    model, call, graph = load_for_run(spec, LocalBackend(), batch, precision, saved)
    plan = load_plan(str(plan_path), graph)
    optimizer = plan_optimizer(plan)
    _check_optimizer(optimizer, "the plan's optimizer")
    shape = launch_shape(plan, _cluster_for(plan, cluster))
    expr = express(plan, graph, model, call, shape.devices)
    if plan.microbatches > 1 and expr.path not in ("fsdp", "fsdp+tp"):
        raise TensorOptError(f"{plan_path} steps {plan.microbatches} micro-batches (gradient accumulation) on the "
                             f"{PATH_TITLES[expr.path]} path, which export writes for FSDP2 plans only (as they are "
                             "priced): run it with tensoropt's executor, one process per device (torchrun "
                             f"--nproc-per-node {saved.num_devices} -m tensoropt.cli run MODEL --plan {plan_path} "
                             "--backend dist)")
    label = plan.plan_id or plan.algorithm or Path(plan_path).stem
    precision = graph.precision
    if precision == Precision.BF16_PARAMS and (expr.path not in ("fsdp", "fsdp+tp") or expr.replicated_params):
        why = (f"it takes the {PATH_TITLES[expr.path]} path" if expr.path not in ("fsdp", "fsdp+tp") else
               f"it keeps {len(expr.replicated_params)} parameter(s) whole outside fully_shard")
        raise TensorOptError(f"a bf16-params plan runs on bfloat16 copies of float32 master parameters, which only "
                             f"FSDP2's MixedPrecisionPolicy gives every module; this plan cannot ({why}): export a "
                             "plan that shards every parameter (tensoropt place --algo fsdp), or capture the model "
                             "in bf16 (--precision bf16, autocast)")
    files = {"train.py": train_script(expr, shape, spec=spec, batch=batch, precision=precision, steps=steps, lr=lr,
                                      seed=seed, optimizer=optimizer, label=label),
             "README.md": readme(expr, shape, plan, spec=spec, steps=steps, label=label, graph_name=graph.name,
                                 batch=graph.batch_size, optimizer=optimizer, precision=precision)}
    _write_directory(out, files, plan)
    return Exported(out, expr, shape)


def export_pipeline(est: PipelineEstimate, spec: str, out: str | os.PathLike, *, batch: int, steps: int = 3,
                    lr: float = 1e-3, optimizer: str = "adamw", times_from: str = "") -> Path:
    """A pipeline plan (:func:`tensoropt.planmodel.pipelined.price_pipeline`) as a directory torchrun
    runs: ``train.py`` and ``README.md`` (:mod:`.pipelined`), written whole or not at all; returns it."""
    directory = Path(out)
    _check_output(directory)
    _check_optimizer(optimizer, "the optimizer")
    spec = absolute_spec(spec)
    files = {"train.py": pipeline_train_script(est, spec=spec, batch=batch, steps=steps, lr=lr, optimizer=optimizer),
             "README.md": pipeline_readme(est, spec=spec, batch=batch, steps=steps, optimizer=optimizer,
                                          times_from=times_from)}
    _write_directory(directory, files, None)
    return directory


def export_pipeline_plan(plan_path: str | os.PathLike, spec: str, out: str | os.PathLike, *, steps: int = 3,
                         lr: float = 1e-3, cluster: str | Cluster | None = None,
                         precision: str | None = None) -> tuple[Path, PipelineEstimate]:
    """A pipeline plan (a frontier's point of source ``pipeline``,
    :func:`~tensoropt.planmodel.pipelined.pipeline_plan`) as :func:`export_pipeline` writes it: the
    model captured at the plan's micro-batch, priced on ``cluster`` (default: the preset the plan
    names) through its kind's device model with the plan's own cut
    (:func:`~tensoropt.planmodel.pipelined.price_plan`) for the README's figures.  Returns the
    directory and that estimate; bad input is a :class:`~tensoropt.errors.TensorOptError`, with
    nothing written."""
    directory = Path(out)
    _check_output(directory)
    saved = Plan.load(plan_path)
    if saved.pipeline is None:
        raise TensorOptError(f"{plan_path} is not a pipeline plan (its options have no 'pipeline')")
    found = _cluster_for(saved, cluster)
    if found is None:
        raise TensorOptError(f"{plan_path} names no preset cluster: give --cluster, the cluster the plan was made for "
                             "(the README prices the pipeline on it)")
    optimizer = plan_optimizer(saved)
    _check_optimizer(optimizer, "the plan's optimizer")
    _, _, graph = load_for_run(spec, LocalBackend(), saved.global_batch_size, precision, saved)
    plan = load_plan(str(plan_path), graph)
    # (a tensor-parallel pipeline's operators priced at their shards too)
    costs = price(profile(graph, shard_degrees=sorted({1, recipe_of(plan).tp}), timed=False), found,
                  plan.all_devices).costs
    est = price_plan(plan, graph, costs, found, optimizer=optimizer)
    return export_pipeline(est, spec, directory, batch=plan.global_batch_size or 0, steps=steps, lr=lr,
                           optimizer=optimizer, times_from=costs_source(costs)), est


def _write_directory(out: Path, files: dict[str, str], plan: Plan | None) -> None:
    """``files`` and ``plan.json`` (where there is a plan) in ``out``, which appears whole or not at all."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        for name, text in files.items():
            (tmp / name).write_text(text, encoding="utf-8")
        (tmp / "train.py").chmod(0o755)
        if plan is not None:
            plan.save(tmp / "plan.json")
        if out.exists():
            out.rmdir()     # empty (checked): the rename takes its place
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
