"""Which of a model's parameters and buffers one rank keeps, and in what form.

Input: the model (built alike on every rank), its plan, the rewritten graph's nodes and sources
and the :class:`.program.Program`.  Output: a :class:`RankState` — made once, before the first
step — after which the model holds, on this rank's device:

- a parameter a sharding level cuts (ZeRO-1/2/3, :mod:`.zero`) as this rank's piece where the
  ranks that read it are its mesh's, one plan device each (else whole, with a note why);
- a weight every reader cuts the same way (channel / reduce splits,
  :func:`.program.parameter_pieces`) as this rank's slice only;
- every other parameter / buffer this rank's nodes read, whole; those of other ranks emptied
  (without ``release_unused``: kept, moved to the device) — so a rank's memory is what the plan
  gives its devices.

It also records who reads what (the same on every rank): each parameter's ranks, the sharded
parameters' levels and meshes, the pieces every rank holds, and the buffer pieces this rank's
write-backs write (what a check compares).  O(parameters + V).

Owns: the model's tensors on this rank, set once.  Must not: send or receive anything (a
sharded piece's collectives are :mod:`.zero`'s, the gradient sums :mod:`.gradients`'), nor run
the graph.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.fx as fx
from torch import nn

from ..execute.rewrite import write_back
from ..execute.sharding import ShardedParameter, flat_piece, sharded_parameters
from ..graph import OpGraph
from ..layouts import Shard
from ..plan import Plan
from .program import Piece, Program, node_arg, parameter_pieces
from .zero import SHARD_TAG, Zero


@dataclass
class _Readers:
    """Who reads one parameter / buffer object: the ranks, its names and its placeholders (a tied
    weight has several)."""

    ranks: set[int]
    names: list[str]
    placeholders: list[str]


class RankState:
    """This rank's parameters and buffers (see the module docstring); ``local_parameters`` are
    the parameters it holds (what its optimizer steps)."""

    def __init__(self, model: nn.Module, graph: OpGraph, plan: Plan, graph_module: fx.GraphModule,
                 sources: Sequence[tuple[str, Any]], program: Program, rank_of: Mapping[str, int],
                 rank: int, device: str, *, release_unused: bool = True):
        self.model = model
        self.rank = rank
        self.device = torch.device(device)
        self._graph_module = graph_module
        self._nodes = list(graph_module.graph.nodes)
        self._program = program
        self._rank_of = rank_of
        #: why a parameter a sharding level cuts is kept whole (the executor's fallbacks)
        self.notes: list[str] = []
        #: this rank's pieces of the parameters the plan's sharding levels cut (:mod:`.zero`)
        self.zero = Zero(rank)
        #: parameter name -> (level, ranks in mesh order) for every sharded parameter; the same on every rank
        self.sharded: dict[str, tuple[int, tuple[int, ...]]] = {}
        #: the parameters whose gradients the flat buffers sum: level 1's whole, not its piece
        self._bucket_params: dict[str, nn.Parameter] = {}
        #: parameter name (a tied weight's first) -> the ranks that read it
        self.parameter_ranks: dict[str, frozenset[int]] = {}
        self.local_parameters: dict[str, nn.Parameter] = {}
        #: parameter name -> rank -> the piece that rank holds (channel / reduce splits: each rank
        #: keeps only its slice, and no gradient sum is needed); the same on every rank
        self.parameter_pieces: dict[str, dict[int, Piece]] = {}
        #: graph node yielding this rank's piece -> parameter
        self.piece_values: dict[str, str] = {}
        #: the cut of a piece this rank holds as is (those nodes do not run here)
        self.cut: set[str] = set()
        self._prepare(graph, plan, sources, release_unused)

    def _prepare(self, graph: OpGraph, plan: Plan, sources: Sequence[tuple[str, Any]], release_unused: bool) -> None:
        """Which ranks read each parameter / buffer (by object: a tied weight may have two
        placeholders), keep this rank's on its device (only its pieces of a sharded one), empty
        the others."""
        by_ph, readers = self._readers(sources)
        specs = sharded_parameters(graph, plan)
        canonical = {id(p): name for name, p in self.model.named_parameters()}   # tied: the first name
        for kind, what in sources:
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

    def _readers(self, sources: Sequence[tuple[str, Any]]) -> tuple[dict[str, tuple[str, Any]], dict[int, _Readers]]:
        """(placeholder -> its source, id(tensor) -> who reads that parameter / buffer)."""
        placeholders = [n for n in self._nodes if n.op == "placeholder"]
        by_ph: dict[str, tuple[str, Any]] = {}
        readers: dict[int, _Readers] = {}
        for ph, (kind, what) in zip(placeholders, sources):
            by_ph[ph.name] = (kind, what)
            if kind in ("parameter", "buffer"):
                t = self.model.get_parameter(what) if kind == "parameter" else self.model.get_buffer(what)
                read = readers.setdefault(id(t), _Readers(set(), [], []))
                read.ranks.update(self._program.placeholder_ranks.get(ph.name, frozenset()))
                read.names.append(what)
                read.placeholders.append(ph.name)
        return by_ph, readers

    def _keep_shard(self, spec: ShardedParameter, name: str, t: nn.Parameter, read: _Readers) -> bool:
        """Keep this rank's piece of a parameter a sharding level cuts (:mod:`.zero`) where the
        ranks that read it are its mesh's, one plan device each; else a note, and it is kept as at
        level 0.  Whether it is sharded."""
        ranks = tuple(self._rank_of[d] for d in spec.devices)
        if not t.requires_grad or len(set(ranks)) != len(ranks) or set(ranks) != set(read.ranks):
            why = ("two of its devices are one rank" if len(set(ranks)) != len(ranks) else
                   "it is not trainable" if not t.requires_grad else
                   f"it is read on ranks {sorted(read.ranks)}, its mesh is on {sorted(set(ranks))}")
            self.notes.append(f"{name}: sharding level {int(spec.level)} kept whole ({why})")
            return False
        index = len(self.sharded)
        self.sharded[name] = (int(spec.level), ranks)
        if self.rank in ranks:
            held = self.zero.keep(spec, name, ranks, t, read.placeholders, SHARD_TAG + 8 * index, self.device)
            self.local_parameters[name] = held.piece
            if spec.level == Shard.OPTIMIZER:
                self._bucket_params[name] = t
        else:
            t.data = torch.empty(0, dtype=t.dtype, device=self.device)
        return True

    def _keep_piece(self, name: str, t: nn.Parameter, read: _Readers) -> bool:
        """Keep only this rank's piece of parameter ``name`` when every reader cuts it the same
        way (:func:`.program.parameter_pieces`); whether it is kept in pieces."""
        me, dev = self.rank, self.device
        ranks = frozenset(read.ranks)
        pieces = (parameter_pieces(self._graph_module.graph, self._program, read.placeholders[0])
                  if len(read.placeholders) == 1 and len(ranks) > 1 and t.requires_grad else None)
        if pieces is None or set(pieces) != ranks:
            return False
        self.parameter_pieces[name] = pieces
        if me in pieces:
            piece = pieces[me]
            t.data = torch.tensor_split(t.data, piece.k, piece.dim)[piece.index].to(dev).clone()
            self.local_parameters[name] = t
            self.piece_values.update({v: name for v in piece.values})
            self.cut.update(piece.cut)
        else:
            t.data = torch.empty(0, dtype=t.dtype, device=dev)
        return True

    def _keep_or_release(self, kind: str, name: str, mod: nn.Module, attr: str, t: torch.Tensor, read: _Readers,
                         release_unused: bool) -> None:
        """A parameter / buffer this rank reads (or every one, without ``release_unused``) moved to
        its device; another rank's emptied here (a buffer under each of its names)."""
        me, dev = self.rank, self.device
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
            if n.op == "call_function" and n.target is write_back and self._program.runs_on(n.name, self.rank):
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
        piece = self.parameter_pieces.get(name, {}).get(self.rank)
        return full if piece is None else torch.tensor_split(full, piece.k, piece.dim)[piece.index]

    def bucket_param(self, name: str) -> nn.Parameter:
        """The parameter object whose gradient a flat buffer holds (level 1's whole, not its piece)."""
        return self._bucket_params.get(name, self.local_parameters[name])

    def shared_parameters(self) -> dict[str, frozenset[int]]:
        """Parameter name -> its ranks, for every parameter whose gradient is summed over the ranks
        that read it: not one kept in pieces, nor one sharded with its gradients (level 2 and up:
        reduce-scattered by :mod:`.zero`)."""
        return {k: r for k, r in self.parameter_ranks.items() if k not in self.parameter_pieces
                and self.sharded.get(k, (0,))[0] < Shard.GRADIENTS}
