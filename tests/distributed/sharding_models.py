"""Models for the sharding-level tests, loaded by path on every rank: the two-layer MLP of
``tests/planmodel/test_memory.py`` (every parameter's size divides by two, so each rank's piece is
exactly half: what the walk charges) and a job that reads what a ZeRO-3 rank holds between uses."""

import gc
import weakref

import torch
from torch import nn

from tensoropt.distributed.jobs import check_plans, load_case, train_like_model
from tensoropt.distributed.run import apply_plan_distributed
from tensoropt.plan import Plan


def even_mlp():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    return model, (torch.randn(8, 16),)


class TiedHead(nn.Module):
    """An embedding (5 × 3), a linear layer (3 → 3) and an output layer reading the embedding's
    weight (tied, as GPT-2's LM head): 15 + 9 + 3 elements, none of which two divides."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(5, 3)
        self.mid = nn.Linear(3, 3)

    def forward(self, ids):
        return nn.functional.linear(self.mid(self.emb(ids)), self.emb.weight)


def tied_head():
    torch.manual_seed(0)
    return TiedHead(), (torch.randint(0, 5, (4, 2)),)


def zero3_holdings(rt, model, plan):
    """One forward + backward of ``plan`` (float64): the parameter bytes this rank holds after
    set-up, between the two readers (right after the first's last part) and after the forward;
    whether any whole gathered for a reader's forward is still alive after the forward; and the
    bytes of the pieces and their gradients after the backward."""
    m, inputs, graph = load_case(model, float64=True, dropout=False, rt=rt)
    ex = apply_plan_distributed(m, inputs, Plan.from_dict(plan), rt, graph=graph)
    zero = ex.zero
    wholes, between = [], []
    before, after = zero.before, zero.after

    def gate(node, env, *rest):
        before(node, env, *rest)
        wholes.extend(weakref.ref(zero.wholes[r.held.name]) for r in zero.gates.get(node, ()))

    def mark(node, env, *rest):
        after(node, env, *rest)
        if node in zero.marks:
            gc.collect()
            between.append({"parameters": sum(p.numel() * p.element_size() for p in m.parameters()),
                            "gathered": zero.held_bytes()["gathered"],
                            "alive": sum(r() is not None for r in wholes)})

    zero.before, zero.after = gate, mark
    held = sum(p.numel() * p.element_size() for p in m.parameters())
    loss = ex.forward(*inputs)
    gc.collect()
    alive = sum(r() is not None for r in wholes)
    ex.backward(loss)
    return {"held": held, "between": between, "gathered": len(wholes), "alive": alive,
            "after_backward": zero.held_bytes()}


def tied_jobs(rt, cases):
    """:func:`check_plans` and :func:`train_like_model` of plans whose tied weights' readers share
    a level (the plan model shards those too: :func:`tensoropt.plan.sharded_parameters`)."""
    return check_plans(rt, cases), train_like_model(rt, cases)
