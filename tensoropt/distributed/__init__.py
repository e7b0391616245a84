"""Plans on ``torch.distributed`` (issue 8): each process (rank) runs the plan devices
mapped to it; values that cross ranks are point-to-point sends (their gradients sent back in
backward) or, where a whole mesh redistributes a split value, all-gathers / all-reduces /
reduce-scatters; replicated parameters get their gradients all-reduced.  gloo on CPU, NCCL on CUDA,
processes started by ``torchrun`` (``python -m tensoropt.distributed MODEL --plan P``) or by
:func:`launch` on one machine.

- :mod:`.runtime` — the process group (:func:`init_runtime`, :class:`Runtime`) and the rank map;
- :mod:`.program` — which rank runs which node, which values cross ranks (moves, collectives), in which order;
- :mod:`.transport` — sends, receives and collectives (also as autograd nodes; collectives native or as
  messages) with timeouts and clear errors;
- :mod:`.run` — :func:`apply_plan_distributed` / :class:`DistributedExecutor`: one rank's interpreter of the graph,
  composed of :mod:`.state` (the parameters and buffers a rank keeps), :mod:`.schedule` (how it walks
  the graph), :mod:`.zero` (the sharding levels) and :mod:`.gradients` (the gradient sums);
- :mod:`.verify` — :func:`compare_distributed`: a step held to the unmodified model;
- :mod:`.jobs` — checking and timing a plan on every rank (tests, ``--check``, ``benchmarks/truth.py``);
- :mod:`.launch` — :func:`launch`: local processes without torchrun;
- :mod:`.calibrate` — what a cross-rank message costs this backend, and links that charge it;
- :mod:`.cli` — :func:`run_distributed`, the body of ``tensoropt run … --backend dist``.

This package owns running a plan across processes.  It must not rewrite a plan differently
from the single-process executor: it runs :func:`tensoropt.execute.rewrite`'s graph and only
decides which rank runs which of its nodes and how values cross ranks.
"""

from .backend import DistributedBackend, run_distributed
from .launch import launch
from .program import CollectiveCall, Move, Program, build_program
from .run import DistributedExecutor, apply_plan_distributed
from .runtime import DEFAULT_TIMEOUT_S, Runtime, init_runtime, parse_rank_map, resolve_rank_map, shutdown
from .verify import compare_distributed

__all__ = ["DistributedBackend", "run_distributed",
           "launch", "CollectiveCall", "Move", "Program", "build_program", "DistributedExecutor",
           "apply_plan_distributed",
           "compare_distributed", "DEFAULT_TIMEOUT_S", "Runtime", "init_runtime", "parse_rank_map",
           "resolve_rank_map", "shutdown"]
