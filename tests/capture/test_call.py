"""Models called the way people call them: keyword inputs, ``*args`` / ``**kwargs`` forwards,
dict / ModelOutput results — captured, and the executor called the same way."""

import copy

import pytest
import torch
from torch import nn

import tensoropt
from tensoropt import NodeConfig, Plan
from tensoropt.capture import ModelCall


class Inner(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(20, 8)
        self.head = nn.Linear(8, 5)

    def forward(self, input_ids, attention_mask=None, scale=1.0):
        h = self.emb(input_ids) * scale
        if attention_mask is not None:
            h = h * attention_mask.unsqueeze(-1)
        return {"hidden": h, "logits": self.head(h), "ids": input_ids}


class ArgsWrapper(nn.Module):
    """``forward(self, *args)`` around a model that returns a dict."""

    def __init__(self):
        super().__init__()
        self.model = Inner()

    def forward(self, *args):
        return self.model(*args)


class KwargsWrapper(nn.Module):
    def __init__(self):
        super().__init__()
        self.model = Inner()

    def forward(self, input_ids, **kwargs):
        return self.model(input_ids, **kwargs)


def ids_and_mask():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 20, (4, 7), generator=g)
    return ids, (torch.rand(4, 7, generator=g) > 0.3).float()


def test_star_args_forward_captures_with_named_inputs_and_the_logits():
    ids, mask = ids_and_mask()
    model = ArgsWrapper()
    graph = tensoropt.capture(model, (ids, mask), method="export")
    assert [n.name for n in graph.nodes.values() if n.kind == "input"] == ["args_0", "args_1"]
    # the default pick from a dict: "logits" (no "loss" present)
    torch.testing.assert_close(graph.exported.module()(*graph.example_inputs), model(ids, mask)["logits"])
    assert set(graph.params) == {"model.emb.weight", "model.head.weight", "model.head.bias"}


def test_keyword_inputs_and_a_named_output():
    ids, mask = ids_and_mask()
    model = KwargsWrapper()
    call = ModelCall.of({"input_ids": ids, "attention_mask": mask, "scale": 0.5}, output="hidden")
    graph = tensoropt.capture(model, call, method="export")
    assert [n.name for n in graph.nodes.values() if n.kind == "input"] == ["input_ids", "attention_mask"]
    torch.testing.assert_close(graph.exported.module()(*graph.example_inputs),
                               model(input_ids=ids, attention_mask=mask, scale=0.5)["hidden"])
    assert call.run(model).shape == (4, 7, 8)


def test_an_unknown_output_names_the_ones_there():
    ids, mask = ids_and_mask()
    with pytest.raises(tensoropt.CaptureError, match=r"no 'logitz'.*'hidden', 'logits', 'ids'"):
        tensoropt.capture(ArgsWrapper(), ModelCall.of((ids, mask), output="logitz"), method="export")


def test_hugging_face_model_output_and_the_planned_module_takes_the_same_call():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(num_hidden_layers=1, hidden_size=32, num_attention_heads=2, intermediate_size=64,
                                  vocab_size=50, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    model = transformers.BertForMaskedLM(cfg).double()
    ids, mask = ids_and_mask()
    call = ModelCall.of({"input_ids": ids, "attention_mask": mask.long()})    # ModelOutput → logits
    graph = tensoropt.capture(model, call, method="export")
    mesh = ("gpu0", "gpu1")
    plan = Plan({n.name: NodeConfig(mesh, "batch" if n.split.batch is not None else "R") for n in graph.ops},
                graph_fingerprint=graph.fingerprint)
    reference = copy.deepcopy(model)
    planned = tensoropt.apply_plan(model, call.args, plan, graph=graph)
    got = planned(input_ids=ids, attention_mask=mask.long())
    torch.testing.assert_close(got, reference(input_ids=ids, attention_mask=mask.long()).logits, rtol=1e-12, atol=1e-12)
