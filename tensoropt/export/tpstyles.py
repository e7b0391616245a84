"""PyTorch's tensor-parallel styles by name: what a module of a tensor-parallel plan becomes under
``parallelize_module`` — the one table both the measurement job
(:func:`tensoropt.distributed.jobs.measure_torch_recipe`) and the exported ``train.py``
(:mod:`.render`, which copies :func:`parallelize_styles`' source) apply, so the two run the same
program.

=====================  ================================================================================
``colwise``            ``ColwiseParallel``: output features cut (the plan's ``channel`` linear)
``rowwise``            ``RowwiseParallel``: input features cut, partial sums all-reduced (``reduce``)
``rowwise_sequence``   ``RowwiseParallel(output_layouts=Shard(0))``: the partial sums reduce-scattered
                       over the rows of tokens (sequence parallelism after a row layer)
``sequence``           ``SequenceParallel(sequence_dim=0)``: the module (a norm) on each rank's rows,
                       its parameters replicated, their gradients all-reduced
``sequence_gathered``  that, then its output all-gathered (``PrepareModuleOutput``) for column layers,
                       handed on as a ``Replicate`` DTensor so their input gradients are summed and
                       reduce-scattered once (Megatron's ``g``; torchtitan's ``PrepareModuleInput``)
``sequence_whole``     that, its output all-gathered and handed on as a plain tensor (a whole reader)
``to_sequence``        ``PrepareModuleOutput``: a whole output cut to this rank's rows (no message)
``from_sequence``      ``PrepareModuleInput``: a first positional input of rows all-gathered whole
=====================  ================================================================================

The rows are dimension 0 — the batch rows the plan's ``batch`` layout cuts, not the positions
torchtitan's ``Shard(1)`` cuts: the same per-token arithmetic, the same bytes a rank when the rows
divide evenly, and exactly the program tensoropt's plan model prices.

Example::

    >>> [type(s).__name__ for s in parallelize_styles("sequence_gathered")]
    ['SequenceParallel', 'PrepareModuleOutput']
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["parallelize_styles", "apply_styles"]


def parallelize_styles(style: str) -> list[Any]:
    """The ``ParallelStyle`` objects (applied in this order) that make a module ``style``."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        PrepareModuleOutput,
        RowwiseParallel,
        SequenceParallel,
    )

    rows, whole = Shard(0), Replicate()

    def gathered(local: bool) -> list[Any]:
        return [SequenceParallel(sequence_dim=0),
                PrepareModuleOutput(output_layouts=rows, desired_output_layouts=whole, use_local_output=local)]

    table: dict[str, Callable[[], list[Any]]] = {
        "colwise": lambda: [ColwiseParallel()],
        "rowwise": lambda: [RowwiseParallel()],
        "rowwise_sequence": lambda: [RowwiseParallel(output_layouts=rows)],
        "sequence": lambda: [SequenceParallel(sequence_dim=0, use_local_output=True)],
        "sequence_gathered": lambda: gathered(False),
        "sequence_whole": lambda: gathered(True),
        "to_sequence": lambda: [PrepareModuleOutput(output_layouts=whole, desired_output_layouts=rows,
                                                    use_local_output=True)],
        "from_sequence": lambda: [PrepareModuleInput(input_layouts=(rows,), desired_input_layouts=(whole,),
                                                     use_local_output=True)],
    }
    if style not in table:
        raise ValueError(f"unknown tensor-parallel style {style!r} (known: {', '.join(table)})")
    return table[style]()


def apply_styles(model: Any, mesh: Any, modules: dict[str, str]) -> None:
    """``parallelize_module`` on each module of ``modules`` (path → style) over ``mesh``, in order."""
    from torch.distributed.tensor.parallel import parallelize_module

    for name, style in modules.items():
        for s in parallelize_styles(style):
            parallelize_module(model.get_submodule(name), mesh, s)
