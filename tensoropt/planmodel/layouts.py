"""Layouts, as types: how a node runs on its mesh (:class:`Layout`) and how a tensor lies on one
(:class:`TensorLayout`), with the predicates the plan model asks instead of comparing strings.

It owns the names and the rules that map one kind of layout onto the other; it must not cost
anything (that is :mod:`.reshard`) nor import the rest of the plan model.  :class:`Layout` is
defined in :mod:`tensoropt.plan` (a :class:`~tensoropt.plan.NodeConfig` validates against it and
:mod:`tensoropt.plan` sits below this package: importing the plan model from there would be a
cycle) and re-exported here, so the plan model imports both kinds from this one module.

Both are ``str`` enums: a member equals and hashes as its string, serialises as it (JSON), and
prints as it (``str``, ``repr``, f-strings), so plans, profiles, reshards and messages written
before keep their exact bytes.

A node's layout decides the tensor layout of its output (:meth:`TensorLayout.written_by`):

=========  ==============
``R``       ``R``
``batch``   ``S(batch)``
``channel`` ``S(channel)``
``reduce``  ``P`` (partial sums)
=========  ==============

and a mesh of one device is always ``R``.  A slice holds ``⌈N / n⌉`` of a tensor's ``N`` bytes
on each of ``n`` devices; every other layout holds all ``N`` (:meth:`TensorLayout.is_slice`).

Example::

    >>> TensorLayout.written_by(Layout.REDUCE), TensorLayout.SB.is_slice, Layout("batch").cuts_params
    ('P', True, False)
"""

from __future__ import annotations

from ..plan import LAYOUTS, SPLIT_LAYOUTS, Layout, NodeConfig, StrValueEnum

__all__ = ["LAYOUTS", "SPLIT_LAYOUTS", "Layout", "TensorLayout", "effective_layout"]


class TensorLayout(StrValueEnum):
    """How a tensor lies on a mesh of ``n`` devices: ``R`` (whole on every device), ``S(batch)`` /
    ``S(channel)`` (device ``i`` holds the ``i``-th ``1/n`` slice along that dimension), ``P``
    (every device a full-sized tensor of partial sums; the value is their sum)."""

    R = "R"
    SB = "S(batch)"
    SC = "S(channel)"
    P = "P"

    @property
    def is_slice(self) -> bool:
        """``S(batch)`` or ``S(channel)``: each device holds ``1/n`` of the tensor."""
        return self in (TensorLayout.SB, TensorLayout.SC)

    @property
    def is_partial(self) -> bool:
        """``P``: every device holds a full-sized tensor of partial sums."""
        return self is TensorLayout.P

    @classmethod
    def written_by(cls, layout: str) -> TensorLayout:
        """The layout of what a node run in ``layout`` (over several devices) writes."""
        return _WRITTEN[Layout(layout)]


_WRITTEN = {Layout.R: TensorLayout.R, Layout.BATCH: TensorLayout.SB, Layout.CHANNEL: TensorLayout.SC,
            Layout.REDUCE: TensorLayout.P}


def effective_layout(config: NodeConfig) -> Layout:
    """:meth:`Layout.of`: the layout ``config`` runs in (``R`` on one device)."""
    return Layout.of(config)
