"""Capture models in this process and print one JSON line per model: its name, fingerprint and
(with ``--nodes``) its nodes' names and ops.  tests/capture/test_canonical.py runs it in fresh
processes under different ``PYTHONHASHSEED`` values and compares what they print.

Model names:

- ``zoo:NAME``: a zoo model, tiny (``tensoropt.load_model("zoo:NAME?tiny=1")``);
- ``suite:NAME``: a factory of examples/real_models.py (the real-architecture suite);
- ``gemma3``: a two-layer Gemma 3 (one sliding-window and one full-attention layer: its rotary
  embeddings are computed by iterating a set of layer types);
- ``set_branches``: :class:`SetBranches` below.

Usage::

    PYTHONHASHSEED=1 python tests/capture/fingerprints.py --nodes gemma3 zoo:bert suite:llama
    PYTHONHASHSEED=1 python tests/capture/fingerprints.py --all      # every zoo and suite model
    PYTHONHASHSEED=1 python tests/capture/fingerprints.py --ci       # the covering subset (CI)

``--ci`` (:func:`ci_names`): one tiny zoo model of each zoo family (:data:`ZOO_CI`) and the
real-model suite's ``CI_SUBSET`` — every capture path (a zoo build's positional tensors, a
factory's keyword inputs and output choice, torchvision, ``*args`` / ``**kwargs`` wrappers) and
every feature the canonical order handles (parallel branches, in-place buffer writes, random
draws, tied weights, recurrences, encoder-decoders).  ``benchmarks/fingerprints.py`` compares
``--all`` across processes.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
import traceback
from pathlib import Path

import torch

import tensoropt
import tensoropt.zoo

ROOT = Path(__file__).resolve().parents[2]


class SetBranches(torch.nn.Module):
    """Two independent branches computed in the order a ``set`` of strings iterates — an order
    that changes with the process's hash seed, as Gemma 3's ``set(config.layer_types)``."""

    def __init__(self):
        super().__init__()
        self.branches = torch.nn.ModuleDict({"left": torch.nn.Linear(8, 8), "right": torch.nn.Linear(8, 8),
                                             "middle": torch.nn.Linear(8, 8)})

    def forward(self, x):
        outs = {}
        for kind in set(self.branches):      # hash-seed order
            outs[kind] = torch.tanh(self.branches[kind](x)) * 2
        return outs["left"] + outs["middle"] * outs["right"]


def gemma3() -> tuple[torch.nn.Module, dict]:
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(0)
    cfg = Gemma3TextConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=2, num_key_value_heads=1, head_dim=16, sliding_window=4,
                           max_position_embeddings=64, rope_theta=10000.0, rope_local_base_freq=100.0,
                           layer_types=["sliding_attention", "full_attention"])
    return Gemma3ForCausalLM(cfg), {"input_ids": torch.randint(0, 64, (2, 8))}


#: the order in which this process traces the branches of a model (it iterates a set)
TRACED_ORDER = {
    "gemma3": lambda: list(set(gemma3()[0].config.layer_types)),   # Gemma3TextModel.forward's loop
    "set_branches": lambda: list(set(SetBranches().branches)),
}


def factories():
    spec = importlib.util.spec_from_file_location("_fingerprints_real_models", ROOT / "examples" / "real_models.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


#: one tiny zoo model per family (``tensoropt/zoo``'s modules) and what each brings to the
#: canonical order; the others (vgg19, wide_resnet152; bert, the hf family's other build) are
#: their family's code at another size or head
ZOO_CI = (
    "amoebanet_d",     # a searched cell: many parallel branches concatenated
    "deeplab_v3",      # atrous pyramid branches, upsampling, batch norm's in-place statistics
    "gnmt",            # an LSTM encoder-decoder with additive attention
    "gpt2",            # Hugging Face (the zoo's hf family): tied embedding / head, dropout draws
    "inception_v3",    # four-way inception branches
    "rnnlm",           # an LSTM language model
    "transformer",     # scaled-dot-product attention, dropout draws
    "unet",            # skip connections concatenated across the network
    "vgg16",           # a plain chain (vgg19 is the same code, deeper)
    "wide_resnet",     # residual blocks, batch norm (wide_resnet152 is the same code, deeper)
)


def ci_names() -> list[str]:
    """The covering subset (module docstring): :data:`ZOO_CI` and the suite's ``CI_SUBSET`` (the
    torchvision ones where torchvision's definitions are installed)."""
    fac = factories()
    return [f"zoo:{n}" for n in ZOO_CI] + [f"suite:{n}" for n in fac.CI_SUBSET
                                          if not (n.startswith("tv_") and not fac.torchvision_available())]


def all_names() -> list[str]:
    names = [f"zoo:{n}" for n in tensoropt.zoo.ZOO]
    fac = factories()
    names += [f"suite:{n}" for n in fac.SUITE if not (n.startswith("tv_") and not fac.torchvision_available())]
    return names


def capture(name: str) -> tensoropt.graph.OpGraph:
    from tensoropt.capture.call import ModelCall

    if name == "gemma3":
        model, inputs = gemma3()
        return tensoropt.capture(model, inputs, method="export")
    if name == "set_branches":
        torch.manual_seed(0)
        return tensoropt.capture(SetBranches(), torch.randn(4, 8), method="export")
    if name.startswith("zoo:"):
        torch.manual_seed(0)
        lm = tensoropt.load_model(f"{name}?tiny=1")
        return tensoropt.capture(lm.model, lm.example_inputs, method="export")
    if name.startswith("suite:"):
        torch.manual_seed(0)
        result = factories().SUITE[name.removeprefix("suite:")]()
        model, inputs = result[0], result[1]
        output = result[2] if len(result) > 2 else None
        return tensoropt.capture(model, ModelCall.of(inputs, output), method="export")
    raise SystemExit(f"unknown model {name!r}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*")
    ap.add_argument("--all", action="store_true", help="every zoo model and every suite model")
    ap.add_argument("--ci", action="store_true", help="one zoo model per family and the suite's CI_SUBSET")
    ap.add_argument("--nodes", action="store_true", help="print the nodes' names and ops too")
    args = ap.parse_args(argv)
    names = args.names + (all_names() if args.all else ci_names() if args.ci else [])
    for name in names:
        t0 = time.perf_counter()
        row: dict = {"name": name}
        try:
            g = capture(name)
            row["fingerprint"] = g.fingerprint
            if args.nodes:
                row["nodes"] = [[n.name, n.op] for n in g]
            if name in TRACED_ORDER:
                row["traced_order"] = TRACED_ORDER[name]()
        except Exception as e:  # noqa: BLE001 - reported, the other models go on
            row["error"] = "".join(traceback.format_exception_only(type(e), e)).strip()[-500:]
        row["seconds"] = round(time.perf_counter() - t0, 2)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
