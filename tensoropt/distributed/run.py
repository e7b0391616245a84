"""Run a plan across processes: each rank executes the nodes of its own plan devices.

:func:`apply_plan_distributed` rewrites the captured graph exactly as the single-process executor
does (:func:`tensoropt.execute.rewrite`, with every plan device given a distinct marker device,
:mod:`.program`) and returns a :class:`DistributedExecutor`.  Its :meth:`~DistributedExecutor.step`
runs one forward + :func:`~tensoropt.measure.step.training_loss` + backward on this rank:

- nodes of other ranks are skipped; a value that crosses ranks is sent point-to-point in forward
  (as soon as it exists, received where its consumer runs) and its gradient sent back in
  backward, from inside this rank's one autograd pass (:mod:`.transport`); splits, gathers,
  partial sums and slices are the executor's own nodes, run on the rank that holds their
  pieces — except a value split over a mesh that every rank of the mesh needs whole: one
  all-gather (``S``) or all-reduce (``P``) over those ranks, or its own block of (``P`` → ``S``):
  one reduce-scatter; their backward is a reduce-scatter / all-reduce / all-gather of the gradients
  (:class:`.program.CollectiveCall`);
- after backward, a parameter read on several ranks (replicated / batch-split nodes, tied
  weights) has its gradient summed over those ranks (one in-place all-reduce of a flat buffer
  per group of ranks, the ``.grad`` being views into it), so every rank holding it sees the
  single-process gradient and an optimizer step leaves identical replicas;
- a weight every reader cuts the same way (channel / reduce splits) is kept in pieces: each
  rank holds only its slice (:func:`.program.parameter_pieces`), its gradient is that slice's
  and nothing is summed;
- a parameter a sharding level cuts (ZeRO-1/2/3, :mod:`.zero`) is kept as the rank's piece —
  of its optimizer state, its gradient (reduce-scattered, not summed) and, at level 3, of itself
  between uses (all-gathered before its reader's forward and again before its backward); the
  optimizer steps the piece, and the updated pieces are all-gathered where the whole is kept
  (:meth:`DistributedExecutor.gather_updated`);
- a rank keeps only the parameters and buffers its nodes read (the others are emptied), so its
  memory is what the plan gives its devices.

A ``bf16`` graph's forward runs under its autocast on every rank
(:func:`tensoropt.capture.precision_context`; the loss and the backward outside it), and
:func:`.verify.compare_distributed` runs the reference under the same autocast, with the bfloat16
tolerance (:mod:`tensoropt.execute.check`, "Mixed precision").

The model and its example inputs are built on every rank from the same spec, and rank 0's weights,
buffers and inputs broadcast to the others before anything runs (:func:`same_as_rank0`): a
factory that draws them without a fixed seed still trains one model.  O(V + E) per step, plus the transfers.

The executor is composed of one owner per concern, each made once at set-up: :mod:`.state`
(which parameters and buffers this rank keeps, :class:`~.state.RankState`), :mod:`.zero` (the
sharding levels' pieces and collectives), :mod:`.schedule` (how this rank walks the graph:
shortcuts, frees, early sends, checkpoint regions) and :mod:`.gradients` (the buckets and the sums
of shared gradients, :class:`~.gradients.GradientSync`); :mod:`.verify` holds a step to the
unmodified model (:func:`~.verify.compare_distributed`).

Owns: one rank's execution of a :class:`.program.Program` — the process groups, the forward over
the graph's nodes (the interpreter, its sends, receives and collectives) and the backward.  Must
not: rewrite the graph differently from the single-process executor, nor talk to peers except
through :class:`.transport.PeerLink` (every wait bounded, every failure named).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import torch
import torch.distributed as dist
import torch.fx as fx
from torch import nn
from torch.utils._pytree import tree_flatten

from ..capture import capture
from ..capture.call import ModelCall
from ..capture.precision import check_executable, precision_context, precision_of
from ..errors import DistributedError
from ..execute.check import tolerance_precision
from ..execute.dropout import dropout_off
from ..execute.randomness import derive_seed, draw_seed
from ..execute.replicas import call_for_capture, replica_slice
from ..execute.rewrite import rewrite
from ..execute.segments import ByReference, by_reference, run_checkpointed
from ..graph import OpGraph
from ..layouts import Collective
from ..plan import Plan
from .gradients import GradientSync, counterpart_sets, in_replicas, replica_ranks, sum_groups
from .program import CollectiveCall, Move, Program, build_program, marker
from .runtime import Runtime, resolve_rank_map
from .schedule import Region, plan_schedule
from .state import RankState
from .transport import (
    HEADER_LEN,
    Channel,
    PeerLink,
    all_gather_with_grad,
    all_reduce_with_grad,
    decode_header,
    encode_header,
    recv_with_grad,
    reduce_scatter_with_grad,
    send_with_grad,
)

# message tags, apart from one another (the gradient sums' from 1 << 24: .gradients; the
# sharding levels' from 3 << 22: .zero)
_GRAD_TAG = 1 << 20  # backward messages' tags, apart from the forward ones
_COLLECTIVE_TAG = 1 << 21   # collectives run as messages: 4 tags each (forward, backward, header)
_LOSS_TAG = (1 << 24) - 8   # the loss's parts summed for the report


class DistributedExecutor:
    """One rank's part of a plan (see the module docstring).  ``local_parameters`` are the
    parameters this rank holds (give them to the optimizer); ``program`` the static plan across
    ranks."""

    def __init__(self, model: nn.Module, graph: OpGraph, plan: Plan, runtime: Runtime,
                 rank_map: Mapping[str, int] | None = None, *, release_unused: bool = True,
                 collectives: str = "auto", loss: str = "train"):
        if loss not in ("train", "check"):
            raise DistributedError(f"loss must be 'train' or 'check', got {loss!r}")
        self.rt = runtime
        #: "train": the training loss (each output's mean, float32); "check": the check's weighted
        #: loss (tensoropt.execute.check.check_loss, float64), for compare_distributed
        self.loss = loss
        check_executable(graph, DistributedError)
        self.plan = plan
        #: False: dropout nodes run as the identity
        self.dropout = True
        #: the seed of this step's keyed random draws (tensoropt.execute.randomness); None: one
        #: derived per step from a base seed rank 0 broadcast at set-up
        self.seed: int | None = None
        self._steps = 0
        #: the micro-batch this forward runs (:meth:`step`; 0 of 1 for a plan without micro-batches)
        self.micro = 0
        self.rank_of, self.replica_ranks = replica_ranks(plan, runtime, rank_map)
        #: which replica this rank runs (0 for a plan without replicas)
        self.replica = next((r for r, ranks in enumerate(self.replica_ranks) if runtime.rank in ranks.values()), 0)
        self.model = model
        plan.check(graph)
        self.batch_dim = graph.batch_dim
        #: the graph's precision: "bf16" runs every forward under autocast (tensoropt.capture.precision)
        self.precision = precision_of(graph)
        #: the dtype whose tolerance a check of this graph is held to (None: the parameters')
        self.check_precision = tolerance_precision(graph)
        index = {d: i for i, d in enumerate(plan.devices)}
        # the loss as terms where the outputs lie: no output is gathered anywhere (as DDP, and as
        # the simulator assumes); a GPT-2's logits sent whole to one rank cost 2 x 8 MiB a step
        rewritten = rewrite(graph, plan, lambda d: marker(index[d]), loss_terms=True if loss == "train" else "check",
                            segments=False)
        self.graph_module = rewritten.module
        self.fallbacks = list(rewritten.fallbacks)
        fx_graph = rewritten.module.graph
        self.program: Program = build_program(fx_graph, plan.devices, self.rank_of, runtime.world_size,
                                              gather_outputs=False)
        self.link = PeerLink(runtime, collectives)
        self._headers: dict[int, tuple[tuple[int, ...], torch.dtype, bool]] = {}
        #: collective index -> (sizes along its dimension per mesh piece, whether any piece needs a gradient)
        self._collective_headers: dict[int, tuple[tuple[int, ...], bool]] = {}
        self._nodes = list(fx_graph.nodes)
        # the same graph with every dropout off, node for node (same names): what runs when
        # ``dropout`` is False
        self._quiet = {n.name: n for n in dropout_off(rewritten.module).graph.nodes}
        self._sources = rewritten.sources
        self._base_seed = self._agree_seed() if any(kind == "seed" for kind, _ in self._sources) else 0
        #: the parameters and buffers this rank keeps, and who reads which (:mod:`.state`)
        self.state = RankState(model, graph, plan, rewritten.module, self._sources, self.program, self.rank_of,
                               runtime.rank, runtime.device, release_unused=release_unused)
        self.fallbacks += self.state.notes
        # the state's records, under the names the executor's callers read
        self.zero = self.state.zero
        self.sharded = self.state.sharded
        self.local_parameters = self.state.local_parameters
        self.parameter_pieces = self.state.parameter_pieces
        self.parameter_ranks = self.state.parameter_ranks
        self.written_buffers = self.state.written_buffers
        self.zero.place(self._nodes, self.program)
        #: how this rank walks the graph: shortcuts, frees, early sends, regions (:mod:`.schedule`)
        self.schedule = plan_schedule(self._nodes, self.program, runtime.rank, rewritten.segments,
                                      rewritten.by_reference)
        self._process_groups = self._make_groups()
        self.zero.connect(self._process_groups)
        #: the buckets and the gradient sums of shared parameters (:mod:`.gradients`)
        self.gradients = GradientSync(self.link, self.state, self._process_groups, self.replica_ranks)

    # ---- set-up ------------------------------------------------------------------------------
    def piece_of(self, name: str, full: torch.Tensor) -> torch.Tensor:
        """What this rank holds of parameter ``name`` when ``full`` is the whole of it
        (:meth:`.state.RankState.piece_of`): to compare with a reference model."""
        return self.state.piece_of(name, full)

    def _make_groups(self) -> dict[frozenset[int], Any]:
        """One process group per set of ranks that share parameters or run a collective (every
        rank creates every group, in the same order, as torch.distributed requires).  With
        replicas: a set of one replica's ranks in every replica (each makes the same collectives
        and sums), and every rank's group of counterparts (the sums across replicas:
        :mod:`.gradients`)."""
        world = frozenset(range(self.rt.world_size))
        inner = {frozenset(c.ranks) for c in self.program.collectives} | {frozenset(ranks) for _, ranks in
                                                                          self.sharded.values()} \
            | sum_groups(self.state)
        wanted = {s for r in inner for s in in_replicas(r, self.replica_ranks, self.replica)}
        wanted |= set(counterpart_sets(self.replica_ranks))
        groups: dict[frozenset[int], Any] = {}
        for ranks in sorted(wanted, key=lambda s: sorted(s)):
            groups[ranks] = None if ranks == world else dist.new_group(sorted(ranks))
        return groups

    def _agree_seed(self) -> int:
        """One base seed for the keyed random draws on every rank: rank 0's draw, broadcast (every
        rank builds its executor at the same point, as it creates the process groups)."""
        t = torch.tensor([draw_seed() if self.rt.rank == 0 else 0], dtype=torch.int64, device=self.rt.device)
        dist.broadcast(t, src=0)
        return int(t.item())

    # ---- one step ----------------------------------------------------------------------------
    def forward(self, *inputs: Any) -> torch.Tensor | None:
        """The forward pass and this rank's part of the loss (the training loss is the sum of the
        parts over :attr:`Program.loss_ranks`; each is computed where the outputs lie); None on a
        rank that holds no model output.  In the graph's precision (a bf16 graph under autocast)."""
        with precision_context(self.precision, self.rt.device):
            return self._forward(*inputs)

    def _forward(self, *inputs: Any) -> torch.Tensor | None:
        dev = torch.device(self.rt.device)
        self.zero.gather_updated(self.link)   # levels 1-2: the pieces the optimizer stepped, if not yet
        leaves = [x for x in tree_flatten(inputs)[0] if isinstance(x, torch.Tensor)]
        params = dict(self.model.named_parameters(remove_duplicate=False))
        buffers = dict(self.model.named_buffers(remove_duplicate=False))
        env: dict[str, Any] = {}
        #: the message roots of this step's backward (see :meth:`backward`)
        self._roots: list[torch.Tensor] = []
        self._anchor = torch.empty(0, device=dev, requires_grad=True)
        ph_index = 0
        out_values: list[Any] = []
        sent: set[int] = set()     # the moves sent so far this step
        for n in self._nodes:
            if n.op == "placeholder":
                kind, what = self._sources[ph_index]
                ph_index += 1
                env[n.name] = self._placeholder_value(kind, what, leaves, params, buffers, dev)
                continue
            if n.op == "output":
                out_values = self._outputs(n, env)
                break
            if n.name in self.schedule.in_region:
                region = self.schedule.regions.get(n.name)
                if region is not None:
                    self._run_region(region, env, params, dev, sent)
                continue
            self.zero.before(n.name, env, self.link, self._anchor, self._roots)
            ran = self._step_node(n, env, params, dev, sent)
            self.zero.after(n.name, env, self.link, self._anchor, self._roots)
            if not ran:
                continue
            for dead in self.schedule.free_after.get(n.name, ()):
                env.pop(dead, None)
        self.link.wait_sends()
        self._steps += 1
        terms = [t for t in out_values if isinstance(t, torch.Tensor)]
        if not terms:
            return None
        part = terms[0]
        for t in terms[1:]:
            part = part + t
        if self.slices > 1:   # the mean over the replicas' micro-batches (execute.replicas)
            part = part * (1.0 / self.slices)
        return part

    def _placeholder_value(self, kind: str, what: Any, leaves: list[torch.Tensor], params: Mapping[str, torch.Tensor],
                           buffers: Mapping[str, torch.Tensor], dev: torch.device) -> Any:
        """What a placeholder of source ``(kind, what)``
        (:attr:`~tensoropt.execute.rewrite.Rewritten.sources`) is this step."""
        if kind == "parameter":
            return params[what]
        if kind == "buffer":
            return buffers[what]
        if kind == "constant":
            return what.to(dev)
        if kind == "seed":
            return self.seed if self.seed is not None else derive_seed(self._base_seed, self._steps)
        if what >= len(leaves):
            raise DistributedError(f"the planned model takes more tensor inputs than the {len(leaves)} "
                                   "given: pass the inputs it was captured with")
        x = leaves[what]
        if self.slices > 1:   # this replica's micro-batch of the step's batch
            x = replica_slice(x, self.replica * self.plan.microbatches + self.micro, self.slices,
                              self.plan.batch_size or 0, self.batch_dim)
        return x.to(dev)

    def _step_node(self, n: fx.Node, env: dict[str, Any], params: Mapping[str, torch.Tensor], dev: torch.device,
                   sent: set[int]) -> bool:
        """This rank's part of node ``n`` (a collective run at its place, a move sent or received,
        a shortcut, or the call), its value into ``env`` and sent early where planned; ``False``
        for a node this rank skips (nothing is freed after it)."""
        me = self.rt.rank
        coll = self.program.collective_at.get(n.name)
        if coll is not None and me in coll.ranks:
            env[coll.result_of(me)] = self._collective(coll, env[coll.sources[coll.ranks.index(me)]])
            self._send_early(coll.result_of(me), env, sent)
        mv = self.program.moves_by_node.get(n.name)
        if mv is not None:
            if me == mv.src and mv.index not in sent:
                self._send(mv, env[mv.source])
            elif me == mv.dst:
                env[n.name] = self._recv(mv)
        elif n.name in self.program.absorbed or n.name in self.schedule.collected:
            pass   # a collective stands for it
        elif n.name in self.state.piece_values:
            env[n.name] = params[self.state.piece_values[n.name]]
        elif n.name in self.state.cut:
            return False
        elif n.name in self.schedule.aliases:
            env[n.name] = env[self.schedule.aliases[n.name]]
        elif n.name in self.schedule.skip_here:
            return False
        elif self.program.runs_on(n.name, self.rt.rank):
            if n.name in self.schedule.in_region:   # checkpointed: the region drops what it saves, gathers again
                env[n.name] = self._call(n, env, dev)
            else:
                with self.zero.saving(n.name):
                    env[n.name] = self._call(n, env, dev)
        if n.name in env:
            self._send_early(n.name, env, sent)
        return True

    def _run_region(self, region: Region, env: dict[str, Any], params: Mapping[str, torch.Tensor],
                    dev: torch.device, sent: set[int]) -> None:
        """A recomputed segment's nodes here as one checkpoint region: it keeps only the values it
        reads from outside (buffers by reference: written after it) and runs again, all of it,
        at its first backward."""
        names = [x for x in region.ext if x in env]

        def run(*values: Any) -> tuple[Any, ...]:
            local = {x: v.value if isinstance(v, ByReference) else v for x, v in zip(names, values)}
            for n in region.nodes:
                # a level-3 parameter is gathered before its reader and dropped after, also when the
                # region runs again in backward (FSDP's reshard after forward, with checkpointing)
                self.zero.before(n.name, local, self.link, self._anchor, self._roots)
                self._step_node(n, local, params, dev, sent)
                self.zero.after(n.name, local, self.link, self._anchor, self._roots)
            return tuple(local.get(o) for o in region.outs)

        got = run_checkpointed(run, *(by_reference(env[x]) if x in region.by_ref else env[x] for x in names))
        for o, v in zip(region.outs, got):
            if v is not None:
                env[o] = v
        for n in region.nodes:
            for dead in self.schedule.free_after.get(n.name, ()):
                env.pop(dead, None)

    def _send_early(self, name: str, env: Mapping[str, Any], sent: set[int]) -> None:
        """Send the moves of value ``name`` planned to leave as soon as it exists (:mod:`.schedule`)."""
        for mv in self.schedule.early_sends.get(name, ()):
            if mv.index not in sent:
                sent.add(mv.index)
                self._send(mv, env[name])

    def _call(self, n: fx.Node, env: dict[str, Any], dev: torch.device) -> Any:
        if not self.dropout:
            n = self._quiet[n.name]

        def value(a: fx.Node) -> Any:
            return env[a.name]

        # the node's arguments with every node replaced by its value (tensors, Python values)
        args = cast(tuple[Any, ...], fx.node.map_arg(n.args, value))
        kwargs = cast(dict[str, Any], fx.node.map_arg(n.kwargs, value))
        if n.op == "call_method":
            assert isinstance(n.target, str)   # a call_method node names its method
            if n.target == "to":
                return args[0].to(dev, **kwargs)
            return getattr(args[0], n.target)(*args[1:], **kwargs)
        if "device" in kwargs and isinstance(kwargs["device"], torch.device):
            kwargs = dict(kwargs, device=dev)
        target = n.target
        assert callable(target)   # a call_function node: the rewritten graph has no modules or attributes
        if n.name in self.schedule.alone:
            return run_checkpointed(target, *args, **kwargs)
        return target(*args, **kwargs)

    def _collective(self, coll: CollectiveCall, x: torch.Tensor) -> torch.Tensor:
        """Run collective ``coll`` with this rank's piece ``x``; returns the whole value."""
        members = tuple(sorted(coll.ranks))
        group = Channel(self._process_groups[frozenset(coll.ranks)], members, _COLLECTIVE_TAG + 4 * coll.index)
        at = coll.ranks.index(self.rt.rank)
        slots = [members.index(r) for r in coll.ranks]   # mesh piece i -> its rank's place in the group
        what = f"{coll.sources[0]} and its {len(coll.ranks) - 1} other pieces over ranks {list(coll.ranks)}"
        if coll.index not in self._collective_headers:
            # the pieces' sizes and whether any needs a gradient: every rank must agree on both
            k = len(coll.ranks)
            header = encode_header(x).to(self.rt.device).view(1, HEADER_LEN)
            heads = self.link.gather_pieces(header, 0, [1] * k, Channel(group.handle, members, group.tag + 2),
                                            f"the header of {what}")
            mesh = [decode_header(heads[s].view(-1).cpu()) for s in slots]
            if coll.kind == Collective.REDUCE_SCATTER:   # whole-sized parts, cut as the executor cuts them
                sizes = tuple(b.shape[coll.cut_dim] for b in torch.tensor_split(x, k, coll.cut_dim))
            else:
                sizes = tuple(shape[coll.dim] for shape, _, _ in mesh) if coll.dim is not None else ()
            self._collective_headers[coll.index] = (sizes, any(grad for _, _, grad in mesh))
        sizes, grad = self._collective_headers[coll.index]
        anchor = self._anchor if grad and torch.is_grad_enabled() else None
        if coll.kind == Collective.ALL_GATHER:
            out, root = all_gather_with_grad(self.link, anchor, x, group, coll.cut_dim, sizes, slots, at, what)
        elif coll.kind == Collective.REDUCE_SCATTER:
            out, root = reduce_scatter_with_grad(self.link, anchor, x, group, coll.cut_dim, sizes, slots, at, what)
        else:
            out, root = all_reduce_with_grad(self.link, anchor, x, group, what)
        if root is not None:
            self._roots.append(root)
        return out

    def _outputs(self, n: fx.Node, env: dict[str, Any]) -> list[Any]:
        me = self.rt.rank
        outs = []
        i = 0   # the index among node outputs, as build_program counts them
        returned = n.args[0]
        assert isinstance(returned, (tuple, list))   # the rewrite's output node returns a tuple
        for a in returned:
            if not isinstance(a, fx.Node):
                outs.append(a)
                continue
            mv = self.program.moves_by_node.get(f"__output{i}")
            i += 1
            if mv is None:
                outs.append(env.get(a.name))
            elif me == mv.src:
                self._send(mv, env[a.name])
                outs.append(None)
            elif me == mv.dst:
                outs.append(self._recv(mv))
            else:
                outs.append(None)
        return outs

    def _send(self, mv: Move, t: torch.Tensor) -> None:
        if mv.index not in self._headers:
            self.link.send(encode_header(t).to(self.rt.device), mv.dst, mv.index, f"the header of {mv.source}")
            self._headers[mv.index] = (tuple(t.shape), t.dtype, t.requires_grad)
        if t.requires_grad and torch.is_grad_enabled():
            self._roots.append(send_with_grad(self.link, t, mv.dst, mv.index, _GRAD_TAG + mv.index, mv.source))
        else:
            self.link.send(t, mv.dst, mv.index, mv.source)

    def _recv(self, mv: Move) -> torch.Tensor:
        if mv.index not in self._headers:
            h = self.link.recv((HEADER_LEN,), torch.int64, mv.src, mv.index, f"the header of {mv.source}")
            self._headers[mv.index] = decode_header(h.cpu())
        shape, dtype, grad = self._headers[mv.index]
        if grad and torch.is_grad_enabled():
            buf, root = recv_with_grad(self.link, self._anchor, shape, dtype, mv.src, mv.index,
                                       _GRAD_TAG + mv.index, mv.source)
            self._roots.append(root)
            return buf
        return self.link.recv(shape, dtype, mv.src, mv.index, mv.source)

    def backward(self, loss: torch.Tensor | None, *, first: bool = True, last: bool = True) -> None:
        """Back-propagate ``loss`` (this rank's part, what :meth:`forward` returned; None where
        it returned None) through every rank — one ``torch.autograd.backward`` per rank whose
        messages exchange the gradients of the values that crossed ranks (:mod:`.transport`) —
        then sum the gradients of shared parameters (see the module docstring).  Of a step of
        micro-batches (:meth:`step`), ``first``: the step's first backward (a ZeRO-1 piece cleared
        by the optimizer starts without a whole gradient); ``last``: its last — only then are the
        shared parameters' gradients, accumulated over the micro-batches in their buckets, summed
        (DDP's ``no_sync`` before it); a sharded gradient (level ≥ 2) is reduce-scattered into its
        piece by every backward, as one step's."""
        me = self.rt.rank
        if me in self.program.loss_ranks and loss is None:
            raise DistributedError(f"rank {me} computes part of the loss: pass the loss forward() returned")
        roots, self._roots = self._roots, []
        if first:
            self.zero.before_backward()
        self.gradients.attach()
        tensors = ([loss] if loss is not None else []) + roots
        grads = ([None] if loss is not None else []) + [torch.empty(0, device=r.device) for r in roots]
        if tensors:
            torch.autograd.backward(tensors, grads)
        self.link.wait_sends()
        if last:
            self.sync_gradients()

    @property
    def gradient_buffers(self) -> list[torch.Tensor]:
        """The flat buffers the shared parameters' gradients live in (kept between steps)."""
        return self.gradients.buffers

    def sync_gradients(self) -> None:
        """Sum the gradients of parameters read on several ranks over those ranks (and across
        replicas: :meth:`.gradients.GradientSync.sync`; after a backward of the caller's own,
        the gradients are copied into the buckets first), then give each ZeRO-1 piece its block
        of the summed whole (:meth:`.zero.Zero.after_sync`)."""
        self.gradients.sync()
        self.zero.after_sync()

    def gather_updated(self) -> None:
        """After the optimizer step: the sharded parameters' updated pieces (levels 1-2) all-gathered
        into the whole every rank of the mesh reads (:meth:`.zero.Zero.gather_updated`; else done
        at the next forward's start)."""
        self.zero.gather_updated(self.link)

    def step(self, *inputs: Any) -> torch.Tensor:
        """forward + backward (+ gradient sums); returns the whole loss (detached) on every rank:
        the parts summed over the ranks (one scalar all-reduce, for the report).  A plan of
        micro-batches: :meth:`forward_backward`'s, the loss their mean."""
        parts = [self.total_loss(loss) for loss in self.forward_backward(*inputs)]
        return parts[0] if len(parts) == 1 else torch.stack(parts).sum()

    @property
    def slices(self) -> int:
        """Into how many slices a step cuts the batch: the replicas' micro-batches (replica ``r``'s
        micro-batch ``j`` is slice ``r · k + j``, :mod:`tensoropt.execute.replicas`)."""
        return len(self.replica_ranks) * self.plan.microbatches

    def forward_backward(self, *inputs: Any) -> list[torch.Tensor | None]:
        """One step's forwards and backwards (+ gradient sums): this rank's loss part of each (detached).  A
        plan of ``k`` micro-batches (:attr:`Plan.microbatches <tensoropt.plan.Plan.microbatches>`)
        takes the step's whole batch and runs ``k`` forwards and backwards on its slices, each loss
        taken ``1/k`` (the step's loss is their mean), every gradient accumulated, summed after the
        last."""
        k = self.plan.microbatches
        losses: list[torch.Tensor | None] = []
        try:
            for j in range(k):
                self.micro = j
                loss = self.forward(*inputs)
                self.backward(loss, first=j == 0, last=j == k - 1)
                # detached: the loss's graph (what its custom functions keep) must not outlive its backward
                losses.append(None if loss is None else loss.detach())
                del loss
        finally:
            self.micro = 0
        return losses

    def total_loss(self, part: torch.Tensor | None) -> torch.Tensor:
        """The loss from every rank's part (:meth:`forward`), on every rank (detached; float32 as
        :func:`~tensoropt.measure.step.training_loss` gives it, float64 for the check's loss)."""
        dtype = torch.float32 if self.loss == "train" else torch.float64
        mine = torch.zeros(1, dtype=dtype, device=self.rt.device) if part is None else \
            part.detach().to(dtype).reshape(1)
        world = Channel(None, tuple(range(self.rt.world_size)), _LOSS_TAG)
        return self.link.all_reduce_out(mine, world, "summing the loss's parts").reshape(())


def same_as_rank0(model: nn.Module, call: ModelCall, runtime: Runtime) -> int:
    """Give every rank rank 0's model and example inputs: its parameters, buffers and input
    tensors broadcast from rank 0 in one message (as DDP's constructor broadcasts rank 0's
    parameters and buffers).  Returns the bytes broadcast.

    Why: every rank builds the model from the user's factory, and a factory that draws its
    weights or its inputs without a fixed seed builds a different model on every rank; each rank
    would then train its own model, and the check fail on every plan (the loss off by 2-50x, every
    gradient off) while the single process passes.  A rank whose model or inputs differ in
    structure (names, shapes, dtypes) is refused, naming the first difference."""
    tensors: list[tuple[str, torch.Tensor]] = [(f"parameter {n}", p) for n, p in model.named_parameters()]
    tensors += [(f"buffer {n}", b) for n, b in model.named_buffers()]
    leaves, _ = tree_flatten((call.args, call.kwargs))
    tensors += [(f"input {i}", t) for i, t in enumerate(leaves) if isinstance(t, torch.Tensor)]
    signature = [(name, tuple(t.shape), str(t.dtype)) for name, t in tensors]
    every: list[Any] = [None] * runtime.world_size
    link = PeerLink(runtime)
    with link.guard("comparing the model built on every rank", None):
        dist.all_gather_object(every, signature)
    for r, theirs in enumerate(every):
        if theirs != signature:
            first = next((f"{a} vs {b}" for a, b in zip(signature, theirs) if a != b),
                         f"{len(signature)} vs {len(theirs)} tensors")
            raise DistributedError(f"rank {runtime.rank} built another model than rank {r} from the same spec "
                                   f"(first difference: {first}): the factory must build the same model and "
                                   "inputs on every rank")
    if not tensors:
        return 0
    with torch.no_grad():
        flat = torch.cat([t.detach().reshape(-1).view(torch.uint8).cpu() for _, t in tensors]).to(runtime.device)
        link.broadcast(flat, "broadcasting rank 0's model and inputs")
        flat = flat.cpu()
        at = 0
        for _, t in tensors:
            size = t.numel() * t.element_size()
            t.copy_(flat[at:at + size].clone().view(t.dtype).reshape(t.shape))   # clone: aligned for the dtype
            at += size
    return int(flat.numel())


def apply_plan_distributed(model: nn.Module, example_inputs: Any, plan: Plan, runtime: Runtime, *,
                           rank_map: Mapping[str, int] | None = None, graph: OpGraph | None = None,
                           release_unused: bool = True, collectives: str = "auto",
                           loss: str = "train", precision: str = "fp32") -> DistributedExecutor:
    """This rank's :class:`DistributedExecutor` for ``plan`` (checked against the graph: a plan made
    for another model is a :class:`~tensoropt.plan.PlanError`; a world size that does not match
    the rank map a :class:`DistributedError`, both before anything runs).  ``graph``: a
    torch.export capture of ``model`` with ``example_inputs`` (captured here otherwise, in
    ``precision``; the executor runs in the graph's precision).
    ``collectives``: how all-gathers, reduce-scatters and all-reduces run (``auto`` / ``native``
    / ``p2p``: :class:`~.transport.PeerLink`).  ``loss``: ``"train"`` (the training loss) or
    ``"check"`` (the check's weighted loss, for :func:`.verify.compare_distributed`)."""
    if not isinstance(plan, Plan):
        raise DistributedError(f"apply_plan_distributed needs a tensoropt.Plan, got {type(plan).__name__}")
    resolve_rank_map(plan.all_devices, runtime.world_size, rank_map)   # refuse before the capture
    if graph is None:
        graph = capture(model, call_for_capture(ModelCall.of(example_inputs), plan), method="export",
                        precision=precision)
    return DistributedExecutor(model, graph, plan, runtime, rank_map, release_unused=release_unused,
                               collectives=collectives, loss=loss)


