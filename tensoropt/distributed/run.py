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
:func:`compare_distributed` runs the reference under the same autocast, with the bfloat16
tolerance (:mod:`tensoropt.execute.check`, "Mixed precision").

The model and its example inputs are built on every rank from the same spec, and rank 0's weights,
buffers and inputs broadcast to the others before anything runs (:func:`same_as_rank0`): a
factory that draws them without a fixed seed still trains one model.  O(V + E) per step, plus the transfers.

Owns: one rank's execution of a :class:`.program.Program` — its parameters and buffers, the
forward over the graph's nodes, the backward and the gradient sums.  Must not: rewrite the
graph differently from the single-process executor, nor talk to peers except through
:class:`.transport.PeerLink` (every wait bounded, every failure named).
"""

from __future__ import annotations

import copy
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.distributed as dist
import torch.fx as fx
from torch import nn
from torch.utils._pytree import tree_flatten

from ..capture import capture
from ..capture.call import ModelCall
from ..capture.precision import check_executable, device_types, precision_context, precision_of
from ..errors import DistributedError
from ..execute.check import (
    Comparison,
    TensorCheck,
    Tolerance,
    check_tensor,
    group_scale,
    loss_of,
    merge_checks,
    step_checks,
    step_seed,
    tolerance_for,
    tolerance_precision,
)
from ..execute.dropout import dropout_off
from ..execute.randomness import KeyedRandomMode, derive_seed, draw_seed, keyed_call
from ..execute.replicas import call_for_capture, replica_call, replica_slice
from ..execute.rewrite import OP_META, rewrite, write_back, writes_buffer
from ..execute.segments import ByReference, by_reference, run_checkpointed
from ..execute.sharding import ShardedParameter, flat_piece, sharded_parameters
from ..graph import OpGraph, Precision
from ..layouts import Collective, Shard, piece_sizes
from ..measure.step import _float_tensors, training_loss
from ..plan import Plan
from .program import CollectiveCall, Move, Piece, Program, build_program, is_move, marker, node_arg, parameter_pieces
from .runtime import Runtime, resolve_rank_map
from .transport import (
    DTYPES,
    HEADER_LEN,
    SEGMENT_BYTES,
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
from .zero import SHARD_TAG, Zero

_GRAD_TAG = 1 << 20  # backward messages' tags, apart from the forward ones
_COLLECTIVE_TAG = 1 << 21   # collectives run as messages: 4 tags each (forward, backward, header)
_SYNC_TAG = 1 << 24         # the gradient all-reduces, one tag per flat buffer
_LOSS_TAG = (1 << 24) - 8   # the loss's parts summed for the report
_REPLICA_TAG = 1 << 25      # the gradients summed across replicas, two tags per parameter


@dataclass
class _Readers:
    """Who reads one parameter / buffer object: the ranks, its names and its placeholders (a tied
    weight has several)."""

    ranks: set[int]
    names: list[str]
    placeholders: list[str]


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
        self.rank_of, self.replica_ranks = _replica_ranks(plan, runtime, rank_map)
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
        self._prepare_state(graph, release_unused)
        self.zero.place(self._nodes, self.program)
        self._plan_shortcuts()
        self._plan_frees()
        self._plan_early_sends()
        self._plan_segments(rewritten.segments, rewritten.by_reference)
        self._make_groups()
        #: (ranks, channel, flat buffer) per group of ranks and dtype, made at the first backward
        self._buckets: list[tuple] = []
        self._bucket_views: list[tuple[nn.Parameter, torch.Tensor]] = []
        self._unfilled: set[int] = set()    # bucket views no gradient has reached this step
        self._collecting = False             # inside backward(): the hooks copy first gradients in
        self._buckets_made = False

    # ---- set-up ------------------------------------------------------------------------------
    def _prepare_state(self, graph: OpGraph, release_unused: bool) -> None:
        """Which ranks read each parameter / buffer (by object: a tied weight may have two
        placeholders), keep this rank's on its device (only its pieces of a sharded one), empty
        the others."""
        by_ph, readers = self._readers()
        #: this rank's pieces of the parameters the plan's sharding levels cut (:mod:`.zero`)
        self.zero = Zero(self.rt.rank)
        specs = sharded_parameters(graph, self.plan)
        #: parameter name -> (level, ranks in mesh order) for every sharded parameter; the same on every rank
        self.sharded: dict[str, tuple[int, tuple[int, ...]]] = {}
        #: the parameters whose gradients the flat buffers sum: level 1's whole, not its piece
        self._bucket_params: dict[str, nn.Parameter] = {}
        canonical = {id(p): name for name, p in self.model.named_parameters()}   # tied: the first name
        self.parameter_ranks: dict[str, frozenset[int]] = {}
        self.local_parameters: dict[str, nn.Parameter] = {}
        #: parameter name -> rank -> the piece that rank holds (channel / reduce splits: each rank
        #: keeps only its slice, and no gradient sum is needed); the same on every rank
        self.parameter_pieces: dict[str, dict[int, Piece]] = {}
        self._piece_values: dict[str, str] = {}    # graph node yielding this rank's piece -> parameter
        self._skip: set[str] = set()                # the cut of a piece this rank holds as is
        for kind, what in self._sources:
            if kind not in ("parameter", "buffer"):
                continue
            mod_path, _, attr = what.rpartition(".")
            mod = self.model.get_submodule(mod_path)
            t = getattr(mod, attr)
            read = readers.pop(id(t), None)
            if read is None:
                continue   # already handled under another name
            first = canonical.get(id(t), read.names[0])
            if kind == "parameter":
                self.parameter_ranks[first] = frozenset(read.ranks)
                spec = next((specs[n] for n in read.names if n in specs), None)
                if spec is not None and self._keep_shard(spec, first, t, read):
                    continue
                if self._keep_piece(first, t, read):
                    continue
            self._keep_or_release(kind, first, mod, attr, t, read, release_unused)
        #: buffer name -> the (dim, k, index) pieces this rank writes (dim None: all of it)
        self.written_buffers = self._written_buffers(by_ph)

    def _readers(self) -> tuple[dict[str, tuple[str, Any]], dict[int, _Readers]]:
        """(placeholder -> its source, id(tensor) -> who reads that parameter / buffer)."""
        placeholders = [n for n in self._nodes if n.op == "placeholder"]
        by_ph: dict[str, tuple[str, Any]] = {}
        readers: dict[int, _Readers] = {}
        for ph, (kind, what) in zip(placeholders, self._sources):
            by_ph[ph.name] = (kind, what)
            if kind in ("parameter", "buffer"):
                t = self.model.get_parameter(what) if kind == "parameter" else self.model.get_buffer(what)
                read = readers.setdefault(id(t), _Readers(set(), [], []))
                read.ranks.update(self.program.placeholder_ranks.get(ph.name, frozenset()))
                read.names.append(what)
                read.placeholders.append(ph.name)
        return by_ph, readers

    def _keep_shard(self, spec: ShardedParameter, name: str, t: nn.Parameter, read: _Readers) -> bool:
        """Keep this rank's piece of a parameter a sharding level cuts (:mod:`.zero`) where the
        ranks that read it are its mesh's, one plan device each; else a note, and it is kept as at
        level 0.  Whether it is sharded."""
        ranks = tuple(self.rank_of[d] for d in spec.devices)
        if not t.requires_grad or len(set(ranks)) != len(ranks) or set(ranks) != set(read.ranks):
            why = ("two of its devices are one rank" if len(set(ranks)) != len(ranks) else
                   "it is not trainable" if not t.requires_grad else
                   f"it is read on ranks {sorted(read.ranks)}, its mesh is on {sorted(set(ranks))}")
            self.fallbacks.append(f"{name}: sharding level {int(spec.level)} kept whole ({why})")
            return False
        index = len(self.sharded)
        self.sharded[name] = (int(spec.level), ranks)
        if self.rt.rank in ranks:
            held = self.zero.keep(spec, name, ranks, t, read.placeholders, SHARD_TAG + 8 * index,
                                  torch.device(self.rt.device))
            self.local_parameters[name] = held.piece
            if spec.level == Shard.OPTIMIZER:
                self._bucket_params[name] = t
        else:
            t.data = torch.empty(0, dtype=t.dtype, device=torch.device(self.rt.device))
        return True

    def _keep_piece(self, name: str, t: nn.Parameter, read: _Readers) -> bool:
        """Keep only this rank's piece of parameter ``name`` when every reader cuts it the same
        way (:func:`.program.parameter_pieces`); whether it is kept in pieces."""
        me, dev = self.rt.rank, torch.device(self.rt.device)
        ranks = frozenset(read.ranks)
        pieces = (parameter_pieces(self.graph_module.graph, self.program, read.placeholders[0])
                  if len(read.placeholders) == 1 and len(ranks) > 1 and t.requires_grad else None)
        if pieces is None or set(pieces) != ranks:
            return False
        self.parameter_pieces[name] = pieces
        if me in pieces:
            piece = pieces[me]
            t.data = torch.tensor_split(t.data, piece.k, piece.dim)[piece.index].to(dev).clone()
            self.local_parameters[name] = t
            self._piece_values.update({v: name for v in piece.values})
            self._skip.update(piece.cut)
        else:
            t.data = torch.empty(0, dtype=t.dtype, device=dev)
        return True

    def _keep_or_release(self, kind: str, name: str, mod: nn.Module, attr: str, t: torch.Tensor, read: _Readers,
                         release_unused: bool) -> None:
        """A parameter / buffer this rank reads (or every one, without ``release_unused``) moved to
        its device; another rank's emptied here (a buffer under each of its names)."""
        me, dev = self.rt.rank, torch.device(self.rt.device)
        if me in read.ranks or not release_unused:
            if t.device != dev:
                if isinstance(t, nn.Parameter):
                    t.data = t.data.to(dev)
                else:
                    mod._buffers[attr] = t.to(dev)
            if kind == "parameter" and me in read.ranks:
                assert isinstance(t, nn.Parameter)
                self.local_parameters[name] = t
        elif isinstance(t, nn.Parameter):   # another rank's: free its memory here
            t.data = torch.empty(0, dtype=t.dtype, device=dev)
        else:
            for other in read.names:
                path, _, buffer = other.rpartition(".")
                self.model.get_submodule(path)._buffers[buffer] = torch.empty(0, dtype=t.dtype, device=dev)

    def _written_buffers(self, by_ph: Mapping[str, tuple[str, Any]]) -> dict[str, list[tuple[int | None, int, int]]]:
        """Buffer name -> the ``(dim, k, index)`` pieces of it this rank's ``write_back`` nodes write."""
        out: dict[str, list[tuple[int | None, int, int]]] = {}
        for n in self._nodes:
            if n.op == "call_function" and n.target is write_back and self._runs_here(n):
                kind, what = by_ph.get(node_arg(n, 0).name, ("", None))
                if kind == "buffer":
                    # write_back(buffer, value, dim, k, index): the rewrite passes Python ints
                    piece = cast(tuple[int | None, int, int], tuple(n.args[2:5]))
                    out.setdefault(what, []).append(piece)
        return out

    def piece_of(self, name: str, full: torch.Tensor) -> torch.Tensor:
        """What this rank holds of parameter ``name`` when ``full`` is the whole of it (its piece
        for a parameter kept in pieces — a sharded one's flat piece — else ``full``): to compare
        with a reference model."""
        held = self.zero.held.get(name)
        if held is not None:
            return flat_piece(full, held.spec, held.index)
        piece = self.parameter_pieces.get(name, {}).get(self.rt.rank)
        return full if piece is None else torch.tensor_split(full, piece.k, piece.dim)[piece.index]

    def _bucket_param(self, name: str) -> nn.Parameter:
        """The parameter object whose gradient a flat buffer holds (level 1's whole, not its piece)."""
        return self._bucket_params.get(name, self.local_parameters[name])

    def _runs_here(self, n: fx.Node) -> bool:
        r = self.program.rank_of_node.get(n.name)
        return r is None or r == self.rt.rank

    def _plan_shortcuts(self) -> None:
        """Nodes of this rank that need not run as calls: a ``.to`` between two plan devices of
        this rank is the value itself (one torch device per rank); a whole buffer cloned for an
        op that updates it in place and then copied back (``write_back``, dim None) can be
        updated in place — the op is its only writer here.  Replicas' clones (no write-back)
        stay clones."""
        self._aliases: dict[str, str] = {}
        self._skip_here: set[str] = set()
        for n in self._nodes:
            if (is_move(n) and n.name not in self.program.moves_by_node and self._runs_here(n)
                    and isinstance(n.args[0], fx.Node) and set(n.kwargs) <= {"non_blocking"}):
                self._aliases[n.name] = n.args[0].name
        for n in self._nodes:
            if not (n.op == "call_function" and n.target is write_back and self._runs_here(n)):
                continue
            buffer, value, dim = n.args[0], n.args[1], n.args[2]
            if dim is None and value.op == "call_method" and value.target == "clone" and len(value.users) == 2:
                src = value.args[0].name
                while src in self._aliases:
                    src = self._aliases[src]
                if src == buffer.name:
                    self._aliases[value.name] = buffer.name
                    self._skip_here.add(n.name)

    def _plan_frees(self) -> None:
        """After which node each local value is dead (as fx's generated code deletes it)."""
        last: dict[str, str] = {}
        me = self.rt.rank
        #: the results of collectives this rank takes part in (set where the collective runs)
        self._collected = {c.result_of(me) for c in self.program.collectives if me in c.ranks}
        for n in self._nodes:
            if n.name in self.program.absorbed or n.name in self._collected:
                continue
            mv = self.program.moves_by_node.get(n.name)
            if mv is not None:
                if mv.src == self.rt.rank:
                    last[mv.source] = n.name
                continue
            if n.op == "output" or self._runs_here(n):
                for a in n.all_input_nodes:
                    last[a.name] = n.name
        for mv in self.program.moves:
            if mv.node.startswith("__output") and mv.src == self.rt.rank:
                last[mv.source] = "output"
        position = {n.name: i for i, n in enumerate(self._nodes)}
        for c in self.program.collectives:   # a piece lives at least until its collective runs
            if me in c.ranks:
                src = c.sources[c.ranks.index(me)]
                if last.get(src) != "output" and position.get(last.get(src), -1) < position[c.at]:
                    last[src] = c.at
        self._free_after: dict[str, list[str]] = {}
        for value, user in last.items():
            self._free_after.setdefault(user, []).append(value)

    def _plan_early_sends(self) -> None:
        """Which of this rank's sends go out as soon as their value exists, not where the graph
        reaches the ``.to`` (where the receiver's consumer is): the rewrite emits a move next to
        its consumer, so a rank would otherwise compute its own next operator before sending what
        its peer waits for — an all-to-all of two ranks ran as two moves a ~3 ms layer apart,
        one rank idle in each (VGG-16's classifier); the simulator starts a transfer when its
        producer is done.  Only values computed by an operator (not parameters, buffers or the
        inputs) that nothing writes into afterwards (``write_back``).  Sends are asynchronous
        (:meth:`PeerLink.send`), so sending early cannot block."""
        me = self.rt.rank
        written = {a.name for n in self._nodes if n.op == "call_function" and n.target is write_back
                   for a in n.all_input_nodes}
        kinds = {n.name: n.op for n in self._nodes}
        self._early_sends: dict[str, list[Move]] = {}
        for mv in self.program.moves:
            if (mv.src == me and not mv.node.startswith("__output") and mv.source not in written
                    and kinds.get(mv.source) in ("call_function", "call_method")):
                self._early_sends.setdefault(mv.source, []).append(mv)

    def _plan_segments(self, segments: Sequence[Sequence[str]], by_reference: frozenset[str]) -> None:
        """How this rank runs each recomputed segment (:func:`~tensoropt.planmodel.walk.recompute_segments`):
        its nodes here as one checkpoint region (:class:`_Region`) when none of them exchanges
        values with another rank — as the single-process executor and the memory walk (a ZeRO
        gather inside runs again with the region, on every rank of the mesh alike); where one
        does (a move, a collective, an early send), each of its operators in a checkpoint of its
        own instead: the same values, but every operator keeps its inputs — more memory than the
        walk gives (a region cannot be run again in backward without its messages)."""
        of = {name: i for i, seg in enumerate(segments) for name in seg}
        tagged: dict[int, list[fx.Node]] = {}
        for n in self._nodes:
            i = of.get(n.meta.get(OP_META, ""))
            if i is not None:
                tagged.setdefault(i, []).append(n)
        position = {n.name: j for j, n in enumerate(self._nodes)}
        me = self.rt.rank
        #: first node of a region -> the region; every node inside one
        self._regions: dict[str, _Region] = {}
        self._in_region: set[str] = set()
        #: operator calls checkpointed on their own (segments that talk to other ranks here)
        self._alone: set[str] = set()
        for members in tagged.values():
            span = self._nodes[position[members[0].name]:position[members[-1].name] + 1]

            def talks(n: fx.Node) -> bool:   # a ZeRO gather may run again: every rank of the mesh does
                coll = self.program.collective_at.get(n.name)
                mv = self.program.moves_by_node.get(n.name)
                return ((coll is not None and me in coll.ranks) or (mv is not None and me in (mv.src, mv.dst))
                        or n.name in self._early_sends or n.name in self.program.absorbed)

            if any(talks(n) for n in span):
                self._alone.update(n.name for n in span if self._runs_here(n) and _is_operator_call(n))
                continue
            nodes = [n for n in span if not writes_buffer(n)]
            if not any(self._runs_here(n) for n in nodes):
                continue
            inside = {n.name for n in nodes}
            ext = list(dict.fromkeys(a.name for n in nodes for a in n.all_input_nodes if a.name not in inside))
            # every value it makes comes out (a collective or a write may read one by name, not as
            # an fx user); those not needed after it are freed as soon as it returns
            outs = tuple(n.name for n in nodes)
            self._regions[nodes[0].name] = _Region(tuple(nodes), tuple(ext), outs, by_reference & set(ext))
            self._in_region.update(inside)

    def _in_replicas(self, ranks: frozenset[int]) -> list[frozenset[int]]:
        """``ranks`` of this replica and the ranks playing their roles in every replica."""
        mine = self.replica_ranks[self.replica]
        device_of = {r: d for d, r in mine.items()}
        return [frozenset(other[device_of[r]] for r in ranks) for other in self.replica_ranks]

    def _make_groups(self) -> None:
        """One process group per set of ranks that share parameters or run a collective (every
        rank creates every group, in the same order, as torch.distributed requires).  With
        replicas: a set of one replica's ranks in every replica (each makes the same collectives
        and sums), and every rank's group of counterparts (the sums across replicas:
        :meth:`sync_gradients`)."""
        world = frozenset(range(self.rt.world_size))
        # a parameter kept in pieces, or sharded with its gradients, has no gradient to sum
        shared = {k: r for k, r in self.parameter_ranks.items() if k not in self.parameter_pieces
                  and self.sharded.get(k, (0,))[0] < Shard.GRADIENTS}
        inner = {frozenset(c.ranks) for c in self.program.collectives} | {frozenset(ranks) for _, ranks in
                                                                          self.sharded.values()} \
            | {r for r in shared.values() if len(r) > 1}
        wanted = {s for r in inner for s in self._in_replicas(r)}
        #: this rank and its counterparts in the other replicas (None without replicas)
        self._counterparts: Channel | None = None
        counterparts = [frozenset(ranks[d] for ranks in self.replica_ranks) for d in self.replica_ranks[0]] \
            if len(self.replica_ranks) > 1 else []
        wanted |= set(counterparts)
        self._process_groups: dict[frozenset[int], Any] = {}
        for ranks in sorted(wanted, key=lambda s: sorted(s)):
            self._process_groups[ranks] = None if ranks == world else dist.new_group(sorted(ranks))
        for ranks in counterparts:
            if self.rt.rank in ranks:
                self._counterparts = Channel(self._process_groups[ranks], tuple(sorted(ranks)), _REPLICA_TAG)
        self.zero.connect(self._process_groups)
        self._groups: list[tuple[frozenset[int], Channel, list[str]]] = []
        for i, ranks in enumerate(sorted({r for r in shared.values() if len(r) > 1}, key=lambda s: sorted(s))):
            names = [k for k, v in shared.items() if v == ranks]
            if self.rt.rank in ranks:
                # the same tag on every rank of the group: its place among all groups
                chan = Channel(self._process_groups[ranks], tuple(sorted(ranks)), _SYNC_TAG + 2 * len(DTYPES) * i)
                self._groups.append((ranks, chan, names))

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
            if n.name in self._in_region:
                region = self._regions.get(n.name)
                if region is not None:
                    self._run_region(region, env, params, dev, sent)
                continue
            self.zero.before(n.name, env, self.link, self._anchor, self._roots)
            ran = self._step_node(n, env, params, dev, sent)
            self.zero.after(n.name, env, self.link, self._anchor, self._roots)
            if not ran:
                continue
            for dead in self._free_after.get(n.name, ()):
                env.pop(dead, None)
        self.link.wait_sends()
        self._steps += 1
        terms = [t for t in out_values if isinstance(t, torch.Tensor)]
        if not terms:
            return None
        part = terms[0]
        for t in terms[1:]:
            part = part + t
        if len(self.replica_ranks) > 1:   # the replicas' mean (execute.replicas)
            part = part * (1.0 / len(self.replica_ranks))
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
        if len(self.replica_ranks) > 1:   # this replica's slice of the step's batch
            x = replica_slice(x, self.replica, len(self.replica_ranks), self.plan.batch_size or 0, self.batch_dim)
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
        elif n.name in self.program.absorbed or n.name in self._collected:
            pass   # a collective stands for it
        elif n.name in self._piece_values:
            env[n.name] = params[self._piece_values[n.name]]
        elif n.name in self._skip:
            return False
        elif n.name in self._aliases:
            env[n.name] = env[self._aliases[n.name]]
        elif n.name in self._skip_here:
            return False
        elif self._runs_here(n):
            if n.name in self._in_region:   # checkpointed: the region drops what it saves, gathers again
                env[n.name] = self._call(n, env, dev)
            else:
                with self.zero.saving(n.name):
                    env[n.name] = self._call(n, env, dev)
        if n.name in env:
            self._send_early(n.name, env, sent)
        return True

    def _run_region(self, region: _Region, env: dict[str, Any], params: Mapping[str, torch.Tensor],
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
            for dead in self._free_after.get(n.name, ()):
                env.pop(dead, None)

    def _send_early(self, name: str, env: Mapping[str, Any], sent: set[int]) -> None:
        """Send the moves of value ``name`` planned to leave as soon as it exists (:meth:`_plan_early_sends`)."""
        for mv in self._early_sends.get(name, ()):
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
        if n.name in self._alone:
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

    def backward(self, loss: torch.Tensor | None) -> None:
        """Back-propagate ``loss`` (this rank's part, what :meth:`forward` returned; None where
        it returned None) through every rank — one ``torch.autograd.backward`` per rank whose
        messages exchange the gradients of the values that crossed ranks (:mod:`.transport`) —
        then sum the gradients of shared parameters (see the module docstring)."""
        me = self.rt.rank
        if me in self.program.loss_ranks and loss is None:
            raise DistributedError(f"rank {me} computes part of the loss: pass the loss forward() returned")
        roots, self._roots = self._roots, []
        self.zero.before_backward()
        self._attach_buckets()
        tensors = ([loss] if loss is not None else []) + roots
        grads = ([None] if loss is not None else []) + [torch.empty(0, device=r.device) for r in roots]
        if tensors:
            torch.autograd.backward(tensors, grads)
        self.link.wait_sends()
        self.sync_gradients()

    def _attach_buckets(self, collect: bool = True) -> None:
        """Give every shared parameter a ``.grad`` that is a view into one flat buffer of its
        group, so :meth:`sync_gradients` all-reduces the buffer itself — no second copy of the
        gradients (DDP's ``gradient_as_bucket_view``).  The buffers are made once and kept
        between steps (as DDP's buckets: a fresh buffer every step cost VGG-16's 32 MiB of
        gradients 12 ms of page faults and zeroing per step on the CPU); a parameter whose
        ``.grad`` is ``None`` gets its first gradient of the step copied into its view by a
        post-accumulate hook (``collect``), later ones are added there in place; a ``.grad``
        already there (accumulation over steps, or a backward of the caller's own) is copied in."""
        if not self._buckets_made:
            self._make_buckets()
            self._buckets_made = True
        self._unfilled = set()
        for i, (p, view) in enumerate(self._bucket_views):
            if p.grad is None:
                self._unfilled.add(i)
            else:
                _into_view(p, view)
        self._collecting = collect

    def _make_buckets(self) -> None:
        me = weakref.ref(self)   # the hooks stay on the model's parameters: they must not keep this alive
        self._bucket_views = []
        for ranks, group, names in self._groups:
            params = [self._bucket_param(k) for k in names if k in self.local_parameters]
            by_dtype: dict[torch.dtype, list[nn.Parameter]] = {}
            for p in params:
                if p.requires_grad:
                    by_dtype.setdefault(p.dtype, []).append(p)
            for dtype, ps in by_dtype.items():
                flat = torch.zeros(sum(p.numel() for p in ps), dtype=dtype, device=ps[0].device)
                at = 0
                for p in ps:
                    view = flat[at:at + p.numel()].view_as(p)
                    at += p.numel()
                    p.register_post_accumulate_grad_hook(_fill_view(me, len(self._bucket_views), view))
                    self._bucket_views.append((p, view))
                # two tags a buffer: an all-reduce as messages is two rounds
                bucket = Channel(group.handle, group.members, group.tag + 2 * DTYPES.index(dtype))
                self._buckets.append((ranks, bucket, flat))

    @property
    def gradient_buffers(self) -> list[torch.Tensor]:
        """The flat buffers the shared parameters' gradients live in (kept between steps)."""
        return [flat for _, _, flat in self._buckets]

    def sync_gradients(self) -> None:
        """Sum the gradients of parameters read on several ranks over those ranks: one in-place
        all-reduce of each group's flat buffer (:meth:`_attach_buckets`; after a backward of the
        caller's own, the gradients are copied in first).  A shared parameter that got no
        gradient this step contributes zeros."""
        if not self._collecting:
            self._attach_buckets(collect=False)
        self._collecting = False
        for i in self._unfilled:
            p, view = self._bucket_views[i]
            if p.grad is None:
                view.zero_()
                p.grad = view
            else:     # replaced since (by hand): fold it into the buffer
                _into_view(p, view)
        self._unfilled = set()
        for i, (ranks, group, flat) in enumerate(self._buckets):
            what = f"summing the gradients shared by ranks {sorted(ranks)}"
            if self._counterparts is None:
                self.link.all_reduce(flat, group, what)
            else:
                self._sum_across_replicas(flat, group, i, what)
        if self._counterparts is not None:   # every other gradient, over this rank's counterparts
            bucketed = {id(p) for p, _ in self._bucket_views}
            for i, (name, p) in enumerate(sorted(self.local_parameters.items())):
                if id(p) not in bucketed and p.grad is not None:
                    chan = Channel(self._counterparts.handle, self._counterparts.members, _REPLICA_TAG + 2 * i)
                    self.link.all_reduce(p.grad, chan, f"summing {name}'s gradient across replicas")
        self.zero.after_sync()

    def _sum_across_replicas(self, flat: torch.Tensor, group: Channel, index: int, what: str) -> None:
        """``flat`` (a bucket summed over ``group`` in every replica) := its sum over every replica,
        in place and hierarchically, as the simulator prices it (:func:`~tensoropt.planmodel.reshard.replica_syncs`):
        a segment at a time (:data:`~.transport.SEGMENT_BYTES`, the staging), reduce-scattered over
        the group, this rank's piece all-reduced with its counterparts', all-gathered back."""
        assert self._counterparts is not None
        across = Channel(self._counterparts.handle, self._counterparts.members, _REPLICA_TAG + (1 << 16) + 2 * index)
        step = max(1, SEGMENT_BYTES // flat.element_size())
        k = len(group.members)
        for at in range(0, flat.numel(), step):
            segment = flat[at:at + step]
            sizes = piece_sizes(segment.numel(), k)
            mine = self.link.reduce_scatter_flat(segment, sizes, group, what)
            self.link.all_reduce(mine, across, what + " across replicas")
            self.link.gather_flat(mine, sizes, group.backward(), what, out=segment)

    def gather_updated(self) -> None:
        """After the optimizer step: the sharded parameters' updated pieces (levels 1-2) all-gathered
        into the whole every rank of the mesh reads (:meth:`.zero.Zero.gather_updated`; else done
        at the next forward's start)."""
        self.zero.gather_updated(self.link)

    def step(self, *inputs: Any) -> torch.Tensor:
        """forward + backward (+ gradient sums); returns the whole loss (detached) on every rank:
        the parts summed over the ranks (one scalar all-reduce, for the report)."""
        loss = self.forward(*inputs)
        self.backward(loss)
        return self.total_loss(loss)

    def total_loss(self, part: torch.Tensor | None) -> torch.Tensor:
        """The loss from every rank's part (:meth:`forward`), on every rank (detached; float32 as
        :func:`~tensoropt.measure.step.training_loss` gives it, float64 for the check's loss)."""
        dtype = torch.float32 if self.loss == "train" else torch.float64
        mine = torch.zeros(1, dtype=dtype, device=self.rt.device) if part is None else \
            part.detach().to(dtype).reshape(1)
        world = Channel(None, tuple(range(self.rt.world_size)), _LOSS_TAG)
        return self.link.all_reduce_out(mine, world, "summing the loss's parts").reshape(())


def _replica_ranks(plan: Plan, runtime: Runtime,
                   rank_map: Mapping[str, int] | None) -> tuple[dict[str, int], list[dict[str, int]]]:
    """``(rank_of, replica_ranks)``: this rank's replica's plan devices → ranks (keyed by the
    first group's devices, as the plan's configurations name them) and the same for every
    replica (one entry without replicas).  Every device of the plan gets its own rank."""
    ranks = resolve_rank_map(plan.all_devices, runtime.world_size, rank_map)
    if not plan.replicas:
        return ranks, [ranks]
    every = [{d0: ranks[d] for d0, d in zip(plan.replicas[0], group)} for group in plan.replicas]
    for r, group in enumerate(every):
        if len(set(group.values())) != len(group) or any(set(group.values()) & set(o.values())
                                                         for o in every[r + 1:]):
            raise DistributedError("a plan with replicas runs every device on its own rank: start "
                                   f"{len(plan.all_devices)} processes (torchrun --nproc-per-node "
                                   f"{len(plan.all_devices)}), one per device")
    order = sorted(plan.replicas[0], key=every[0].__getitem__)
    if any(sorted(plan.replicas[0], key=g.__getitem__) != order for g in every):
        raise DistributedError("a plan with replicas needs the same rank order in every replica (the i-th device of "
                               "each group on ranks in the first group's order): use the default device map")
    mine = next((g for g in every if runtime.rank in g.values()), every[0])
    return mine, every


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
    ``"check"`` (the check's weighted loss, for :func:`compare_distributed`)."""
    if not isinstance(plan, Plan):
        raise DistributedError(f"apply_plan_distributed needs a tensoropt.Plan, got {type(plan).__name__}")
    resolve_rank_map(plan.all_devices, runtime.world_size, rank_map)   # refuse before the capture
    if graph is None:
        graph = capture(model, call_for_capture(ModelCall.of(example_inputs), plan), method="export",
                        precision=precision)
    return DistributedExecutor(model, graph, plan, runtime, rank_map, release_unused=release_unused,
                               collectives=collectives, loss=loss)


def compare_distributed(executor: DistributedExecutor, reference: nn.Module, example_inputs: Any) -> Comparison:
    """:func:`tensoropt.execute.compare_with_model` across ranks: ``reference`` (the unmodified
    model, on every rank) runs one step here; the executor one distributed step; each rank
    compares, by the one tolerance rule (:func:`tensoropt.execute.check.check_tensor`), the
    gradients of the parameters it holds (its piece of one kept in pieces) and the buffers it
    writes, rank 0 the loss; the union (worst per name; a gradient no rank holds fails) is
    returned on every rank.  Random ops on: both sides draw the same keyed masks.

    The loss is the executor's: the check's weighted loss (:func:`~tensoropt.execute.check.check_loss`,
    which sees every gradient, also before a final LayerNorm) when it was made with
    ``loss="check"`` — computed as terms where the outputs lie, inside the rewritten graph — else
    the training loss (each output's mean)."""
    call = ModelCall.of(example_inputs)
    args = call.tensors_for(reference)     # the executor takes the graph's inputs in the graph's order
    seed = step_seed(0)
    ref = _reference_step(executor, reference, call, args, seed)
    for p in executor.local_parameters.values():
        p.grad = None
    keep, executor.seed = executor.seed, seed
    try:
        loss = executor.step(*args)
    finally:
        executor.seed = keep
    mine = _rank_checks(executor, loss, ref)
    every: list[Any] = [None] * executor.rt.world_size
    with executor.link.guard("gathering the check's results", None):
        dist.all_gather_object(every, mine)
    checks = merge_checks(c for part in every for c in part)
    held = {c.name for c in checks if c.kind == "grad"}
    for k in sorted(set(ref.grads) - held):   # a gradient no rank holds
        checks.append(check_tensor("grad", k, None, ref.grads[k]))
    dtype = next((str(p.dtype).removeprefix("torch.") for p in reference.parameters()), "")
    if executor.precision != Precision.FP32:
        dtype += f" under {executor.precision} autocast"
    return Comparison(tuple(checks), dtype, "weighted" if executor.loss == "check" else "training_loss")


@dataclass
class _ReferenceStep:
    """The reference model's step: its loss and that loss's ``G``, its gradients and buffers
    after the step, and the groups' ``G`` (:func:`~tensoropt.execute.check.group_scale`)."""

    loss: torch.Tensor
    loss_scale: float
    grads: dict[str, torch.Tensor]
    buffers: dict[str, torch.Tensor]
    grad_scale: float
    buffer_scale: float
    loss_tolerance: Tolerance


def _reference_step(executor: DistributedExecutor, reference: nn.Module, call: ModelCall, args: Sequence[Any],
                    seed: int) -> _ReferenceStep:
    """One forward + backward of ``reference`` with the executor's loss: the model's random draws
    keyed by ``seed``, as the plan's, under the plan's autocast.  A plan with replicas: the mean
    of the steps of ``R`` copies of ``reference``, each on its replica's slice of the batch
    (:mod:`tensoropt.execute.replicas`: what data parallelism computes), the buffers those of
    this rank's replica's copy."""
    reference.zero_grad(set_to_none=True)
    replicas = executor.plan.num_replicas
    copies = [reference] + [copy.deepcopy(reference) for _ in range(replicas - 1)]
    losses, scales = [], []
    loss_tolerance = None
    for r, model in enumerate(copies):
        part = call if replicas == 1 else replica_call(call, r, replicas, executor.plan.batch_size or 0,
                                                       executor.batch_dim)
        where = device_types([*model.parameters(), *args])
        with KeyedRandomMode(seed), precision_context(executor.precision, where):
            ref_out = part.run(model)
        if executor.loss == "check":
            one, scale, loss_tolerance = loss_of(ref_out, None)
        else:
            one = training_loss(ref_out)
            scale = sum(float(t.detach().float().abs().mean()) for t in _float_tensors(ref_out) if t.numel())
            loss_tolerance = tolerance_for(one.dtype)
        (one / replicas if replicas > 1 else one).backward()
        losses.append(one.detach())
        scales.append(scale)
    ref_loss = losses[0] if replicas == 1 else torch.stack(losses).mean()
    loss_scale = sum(scales) / replicas
    assert loss_tolerance is not None
    if replicas > 1:   # the copies' gradients into the reference's: their mean
        for p, *others in zip(reference.parameters(), *(m.parameters() for m in copies[1:])):
            for o in others:
                if o.grad is not None:
                    p.grad = o.grad if p.grad is None else p.grad + o.grad
    ref_grads = {k: p.grad.detach() for k, p in reference.named_parameters() if p.grad is not None}
    ref_buffers = dict(copies[executor.replica].named_buffers())
    return _ReferenceStep(ref_loss, loss_scale, ref_grads, ref_buffers, group_scale(ref_grads.values()),
                          group_scale(v for v in ref_buffers.values() if v.is_floating_point()), loss_tolerance)


def _rank_checks(executor: DistributedExecutor, loss: torch.Tensor, ref: _ReferenceStep) -> list[TensorCheck]:
    """This rank's checks: the loss (rank 0), the gradients of the parameters it holds and the
    floating buffers it writes (a channel shard only its slice)."""
    mine: list[TensorCheck] = []
    tol = executor.check_precision   # a bf16 graph: the bfloat16 tolerance (None: by dtype)
    if executor.rt.rank == 0:    # the loss is the same on every rank: the parts summed
        # the one-process check's rule for the loss (execute.check.step_checks): its tolerance
        # from the outputs it sums (loss_of), loosened to the graph's precision
        mine += step_checks(ref.loss, loss, ref.loss_scale, {}, {}, {}, {}, missing_grads=False,
                            loss_tolerance=ref.loss_tolerance, precision=tol)
    for k, p in executor.local_parameters.items():
        want = executor.piece_of(k, ref.grads[k]) if k in ref.grads else None
        mine.append(check_tensor("grad", k, p.grad, want, group=ref.grad_scale, precision=tol))
    own_buffers = dict(executor.model.named_buffers())
    for k, pieces in executor.written_buffers.items():
        if own_buffers[k].is_floating_point():
            for dim, parts, index in pieces:   # a channel shard writes only its slice
                a, b = own_buffers[k], ref.buffers[k]
                if dim is not None:
                    a, b = torch.tensor_split(a, parts, dim)[index], torch.tensor_split(b, parts, dim)[index]
                mine.append(check_tensor("buffer", k, a, b, group=ref.buffer_scale, precision=tol))
    return mine


def _fill_view(executor: weakref.ref[DistributedExecutor], index: int,
               view: torch.Tensor) -> Callable[[torch.Tensor], None]:
    """A post-accumulate-grad hook: the parameter's first gradient of the step moves into its
    bucket view (which then becomes its ``.grad``, so later contributions add in place).  Only
    while ``executor`` (a weak reference) is inside its backward."""
    def hook(p: torch.Tensor) -> None:
        ex = executor()
        if ex is None or not ex._collecting:
            return
        _into_view(p, view)
        ex._unfilled.discard(index)
    return hook


def _into_view(p: torch.Tensor, view: torch.Tensor) -> None:
    """Make ``view`` (a parameter's slot in its bucket) ``p``'s ``.grad``, holding the gradient
    ``p`` has now (not ``None``)."""
    if p.grad is not view:
        assert p.grad is not None   # the callers' invariant (docstring)
        view.copy_(p.grad)
        p.grad = view


@dataclass(frozen=True)
class _Region:
    """A recomputed segment as one rank runs it: its nodes (from its first to its last, those
    that write into buffers left out: they run after it), the values it reads from outside, those
    read after it, and which outside values are buffers (passed by reference)."""

    nodes: tuple[fx.Node, ...]
    ext: tuple[str, ...]
    outs: tuple[str, ...]
    by_ref: frozenset[str]


def _is_operator_call(n: fx.Node) -> bool:
    """An operator's own call (an ATen op, or its keyed random draw), not a move, cut or copy."""
    return n.op == "call_function" and (isinstance(n.target, torch._ops.OpOverload) or n.target is keyed_call)
