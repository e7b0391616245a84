"""capture(): torch.export first, torch.fx as fallback; split rules from op semantics."""

import contextlib
import sys

import pytest
import torch

from tensoropt import CaptureError, NodeConfig, Plan, capture
from tensoropt.execute.check import check_plan
from tests.conftest import model_param_bytes

capture_package = sys.modules["tensoropt.capture"]     # the package: `tensoropt.capture` is the function


def node_by_op(g, op):
    return next(n for n in g.ops if n.op == op)


@pytest.mark.parametrize("method", ["export", "fx"])
def test_small_cnn_graph(small_cnn, method):
    model, inputs = small_cnn
    g = capture(model, inputs, method=method)
    assert g.source == ("torch.export" if method == "export" else "torch.fx")
    assert g.batch_size == 4
    conv = node_by_op(g, "aten.conv2d.default")
    assert conv.outputs[0].shape == (4, 8, 14, 14)
    assert (conv.split.batch, conv.split.channel) == (0, 1)
    assert set(conv.params) == {"conv.weight", "conv.bias"}
    assert conv.module_path == "conv"
    bn = node_by_op(g, "aten.batch_norm.default")
    assert bn.split.batch == 0 and not bn.split.batch_exact   # per-shard statistics
    head = node_by_op(g, "aten.linear.default")
    assert head.outputs[0].shape == (4, 4) and head.split.channel == 1
    # every parameter counted once, the unused one too
    assert g.param_bytes() == model_param_bytes(model)
    assert g.params["unused.weight"].owner is None
    assert g.params["bn.running_mean"].kind == "buffer"
    # edge bytes are the tensor the consumer reads
    e = next(e for e in g.edges if e.src == conv.name)
    assert e.nbytes == 4 * 8 * 14 * 14 * 4


def test_tied_parameter_owned_once(tied_lm):
    model, inputs = tied_lm
    g = capture(model, inputs)
    assert g.param_bytes() == model_param_bytes(model)
    (p,) = [p for p in g.params.values() if p.kind == "parameter"]
    assert g[p.owner].op == "aten.embedding.default"
    assert [g[r].op for r in p.readers] == ["aten.linear.default"]
    assert p.name in g[p.readers[0]].param_reads


class Mixer(torch.nn.Module):
    """Ops that mix samples along the batch and so must not be batch-split."""

    def forward(self, x):                       # x: (B, T, C)
        a = torch.softmax(x, dim=0)             # across samples
        b = torch.softmax(x, dim=-1)            # within a sample
        c = torch.cat([x, x], dim=0)            # stacks batches
        d = x.transpose(0, 1).reshape(x.shape[1] * x.shape[0], x.shape[2])  # batch behind time
        e = x.reshape(x.shape[0] * x.shape[1], x.shape[2])                  # batch in front
        return a.sum() + b.sum() + c.sum() + d.sum() + e.sum()


def test_batch_mixing_ops_are_not_batch_split():
    g = capture(Mixer(), (torch.randn(4, 3, 5),))
    softmaxes = [n for n in g.ops if "softmax" in n.op]
    assert [n.split.batch for n in softmaxes] == [None, 0]
    assert [n.split.channel for n in softmaxes] == [None, None]
    assert node_by_op(g, "aten.cat.default").split.batch is None
    reshapes = [n for n in g.ops if n.op in ("aten.reshape.default", "aten.view.default")]
    assert [n.split.batch for n in reshapes][-2:] == [None, 0]
    # a sum over everything leaves no batch dimension
    assert all(n.split.batch is None for n in g.ops if n.op == "aten.sum.default")


class Slicer(torch.nn.Module):
    def forward(self, x):
        return x[:] * 2, x[1:] * 3, x[:, 1:] * 4


def test_a_slice_that_takes_the_whole_batch_keeps_it_splittable():
    g = capture(Slicer(), (torch.randn(4, 3),))
    slices = [n for n in g.ops if n.op == "aten.slice.Tensor"]
    whole, part, columns = ([n for n in slices if n.outputs[0].shape == shape][0]
                            for shape in ((4, 3), (3, 3), (4, 2)))
    assert whole.split.batch == 0 and columns.split.batch == 0
    assert part.split.batch is None            # x[1:] drops a sample: not two independent halves


def test_batch_dims_are_symbolic_not_size_based():
    """A dimension that happens to equal the batch size is not the batch dimension."""

    class Square(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x):           # x: (4, 4): batch 4, features 4
            return self.lin(x).t()      # (features, batch)

    g = capture(Square(), (torch.randn(4, 4),))
    t = node_by_op(g, "aten.t.default")
    assert t.outputs[0].batch_dim == 1 and t.outputs[0].channel_dim == 0


class Heads(torch.nn.Module):
    """Attention's shapes around its core: a projection to 12 features, split into 3 heads of 4,
    heads to dimension 1, merged back; the heads folded into the time axis after it, and before it."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(6, 12)

    def forward(self, x):                                    # x: (B, T, 6)
        b, t = x.shape[0], x.shape[1]
        heads = self.proj(x).view(b, t, 3, 4).transpose(1, 2)          # (B, 3, T, 4)
        merged = heads.transpose(1, 2).reshape(b, t, 12)                # (B, T, 12)
        outer = heads.reshape(b, 3 * t, 4)                              # (heads, time) in one dimension
        inner = heads.transpose(1, 2).reshape(b, t * 3, 4)             # (time, heads) in one dimension
        return merged.sum() + outer.sum() + inner.sum()


def test_a_head_split_and_merge_keep_the_channels():
    # worked by hand: a contiguous piece of 12 features is a contiguous piece of the 3 heads (the
    # split's outermost factor) and back; folded with time, the heads stay the channels only as the
    # outer factor (a third of 15 rows is one head's 5 steps; with time outside, it is no set of heads)
    g = capture(Heads(), (torch.randn(2, 5, 6),))
    views = [n for n in g.ops if n.op in ("aten.view.default", "aten.reshape.default", "aten._unsafe_view.default")]
    channels = [(n.outputs[0].shape, n.outputs[0].channel_dim) for n in views]
    assert ((2, 5, 3, 4), 2) in channels       # the split: the heads
    assert ((2, 5, 12), 2) in channels         # the merge: the features again
    assert ((2, 15, 4), 1) in channels and ((2, 15, 4), None) in channels


class Gate(torch.nn.Module):
    def forward(self, x):
        if x.sum() > 0:           # Python branch on a tensor value
            return x * 2
        return x


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.gate = Gate()

    def forward(self, x):
        return self.gate(self.lin(x))


def test_data_dependent_branch_names_module_and_fix():
    with pytest.raises(CaptureError) as e:
        capture(Net(), (torch.randn(2, 8),))
    msg = str(e.value)
    assert "torch.export" in msg and "torch.fx" in msg
    assert "'gate'" in msg                      # the module path
    assert "torch.where" in msg                 # what to try
    assert "if x.sum() > 0" in msg              # the construct, with its source line


def test_inputs_that_do_not_run_the_model():
    with pytest.raises(CaptureError) as e:
        capture(Net(), (torch.randn(2, 5),))
    msg = str(e.value)
    assert "example inputs do not run Net" in msg
    assert "'lin'" in msg and "shapes" in msg


def test_unsupported_custom_op_is_named():
    @torch.library.custom_op("tensoropt_test::mystery", mutates_args=())
    def mystery(x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    class UsesMystery(torch.nn.Module):
        def forward(self, x):
            return torch.ops.tensoropt_test.mystery(x) + 1

    with pytest.raises(CaptureError) as e:
        capture(UsesMystery(), (torch.randn(2, 3),), method="export")
    msg = str(e.value)
    assert "tensoropt_test::mystery" in msg
    assert "register_fake" in msg


def test_not_a_module():
    with pytest.raises(CaptureError, match="needs a torch.nn.Module"):
        capture(lambda x: x, (torch.randn(2),))


def test_a_data_dependent_shape_names_the_module_and_the_op():
    class Select(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)

        def forward(self, x):
            keep = torch.nonzero(x[:, 0] > 0).squeeze(1)
            return self.lin(x[keep])

    class Outer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList([Select()])

        def forward(self, x):
            return self.layers[0](x)

    with pytest.raises(CaptureError, match=r"layers\.0 \(Select\): aten\.nonzero\.default has a data-dependent shape"):
        capture(Outer(), (torch.randn(4, 8),))


@pytest.mark.parametrize("method", ["export", "fx"])
def test_bf16_is_captured_under_autocast(small_cnn, method):
    # torch.export (and ShapeProp) under autocast record its dtypes; no cast node is added: the
    # graph is bf16 because every stage runs it under the same autocast (graph.precision says so)
    model, inputs = small_cnn
    g32, g16 = capture(model, inputs, method=method), capture(model, inputs, method=method, precision="bf16")
    assert (g32.precision, g16.precision) == ("fp32", "bf16") and g16.fingerprint != g32.fingerprint
    conv32, conv16 = node_by_op(g32, "aten.conv2d.default"), node_by_op(g16, "aten.conv2d.default")
    assert conv16.outputs[0].dtype == "bfloat16" and conv16.outputs[0].nbytes * 2 == conv32.outputs[0].nbytes
    assert [n.op for n in g16.ops] == [n.op for n in g32.ops]             # the same operators
    assert g16.param_bytes() == g32.param_bytes() == model_param_bytes(model)   # float32 master weights
    assert any("autocast" in note for note in g16.notes)
    assert not torch.is_autocast_enabled("cpu")                             # left as it was
    with pytest.raises(CaptureError, match="precision must be one of fp32, bf16"):
        capture(model, inputs, precision="fp16")


class TiedLM(torch.nn.Module):
    """An embedding whose weight the output layer reads too (tied), a layer norm, a float input."""

    def __init__(self):
        super().__init__()
        self.emb, self.norm, self.mix = torch.nn.Embedding(16, 8), torch.nn.LayerNorm(8), torch.nn.Linear(3, 8)
        self.head = torch.nn.Linear(8, 16, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids, extra):
        return self.head(self.norm(self.emb(ids) + self.mix(extra)))


def test_bf16_params_computes_on_bf16_copies_of_float32_masters():
    # FSDP2's MixedPrecisionPolicy(param_dtype=bf16): every operator on bf16 parameters (and the float
    # input cast, as FSDP2's root casts it); the graph keeps the float32 masters, the tie kept
    model = TiedLM()
    inputs = (torch.randint(0, 16, (2, 5)), torch.randn(2, 5, 3))
    g32, gp = capture(model, inputs), capture(model, inputs, precision="bf16-params")
    assert gp.precision == "bf16-params" and gp.fingerprint != g32.fingerprint
    assert {n.outputs[0].dtype for n in gp.ops if n.outputs and n.outputs[0].dtype.startswith(("float", "bfloat"))} \
        == {"bfloat16"}
    assert {q: (p.dtype, p.nbytes) for q, p in gp.params.items()} == \
        {q: (p.dtype, p.nbytes) for q, p in g32.params.items()}
    assert gp.param_bytes() == model_param_bytes(model)                     # float32 masters, the tie once
    assert gp.params["emb.weight"].readers and gp.compute_bytes("emb.weight") == 16 * 8 * 2
    assert g32.compute_bytes("emb.weight") == 16 * 8 * 4
    assert all(p.dtype == torch.float32 for p in model.parameters())       # the model itself untouched
    assert model.head.weight is model.emb.weight
    assert any("bf16-params" in note for note in gp.notes)


def test_a_dtype_conversion_is_a_copy_and_a_same_dtype_to_a_view():
    class Casts(torch.nn.Module):
        def forward(self, x):
            return x.to(torch.float32) * 2, x.to(torch.bfloat16) * 2

    g = capture(Casts(), (torch.randn(4, 6),))
    same, conv = (next(n for n in g.ops if n.op.startswith("aten.to") and n.outputs[0].dtype == dt)
                  for dt in ("float32", "bfloat16"))
    assert same.metadata_only and not conv.metadata_only     # a new bf16 tensor: its bytes are memory


class Sampler(torch.nn.Module):
    """Reparameterised sampling as diffusers' ``randn_tensor`` writes it: noise of an activation's
    shape (the batch in it), drawn with ``generator=`` passed through (``None`` unless given)."""

    def __init__(self, generator=None):
        super().__init__()
        self.generator = generator

    def forward(self, mu, logvar):
        std = torch.exp(0.5 * logvar)
        eps = torch.randn(mu.shape, generator=self.generator, dtype=mu.dtype)
        return mu + eps * std


class TinyVAE(torch.nn.Module):
    def __init__(self, generator=None):
        super().__init__()
        self.enc = torch.nn.Linear(6, 8)
        self.sample = Sampler(generator)
        self.dec = torch.nn.Linear(4, 6)

    def forward(self, x):
        mu, logvar = self.enc(x).chunk(2, dim=-1)
        return self.dec(self.sample(mu, logvar))


def batch_split_plan(graph, mesh=("gpu0", "gpu1")):
    configs = {n.name: NodeConfig(mesh, "batch" if n.split.batch is not None else "R") for n in graph.ops}
    return Plan(configs, graph_fingerprint=graph.fingerprint)


def test_a_random_draw_at_the_batchs_shape_keeps_the_batch_dynamic():
    torch.manual_seed(0)
    model, x = TinyVAE(), torch.randn(5, 6)
    g = capture(model, (x,), method="export")
    draw = next(n for n in g.ops if n.op.startswith("aten.randn"))
    assert draw.split.batch == 0 and draw.module_path == "sample"
    assert not any("fixed" in note or "specialised" in note for note in g.notes)
    # split along the batch over two devices, every piece drawing its own rows of the noise: the
    # plan trains as the eager model does (its draw keyed alike)
    cmp = check_plan(model, (x,), batch_split_plan(g), g)
    assert cmp.passed, cmp.describe()


def test_an_op_that_needs_a_static_batch_is_exported_static_with_a_note(monkeypatch):
    """Without the ``generator=None`` rewrite ``aten.randn.generator`` needs concrete sizes: the
    export falls back to the example's batch size and the note names the module and the op."""
    monkeypatch.setattr(capture_package, "_DefaultGeneratorOmitted", contextlib.nullcontext)
    torch.manual_seed(0)
    model, x = TinyVAE(), torch.randn(5, 6)
    g = capture(model, (x,), method="export")
    (note,) = [n for n in g.notes if "fixed" in n]
    assert "batch size fixed at 5: aten.randn.generator in module 'sample'" in note
    assert "eps = torch.randn(mu.shape" in note
    assert all(n.split.batch is None for n in g.ops)
    cmp = check_plan(model, (x,), batch_split_plan(g), g)      # nothing batch split: all replicated
    assert cmp.passed, cmp.describe()


def test_a_draw_from_the_models_own_generator_is_refused_with_the_way_out():
    model = TinyVAE(generator=torch.Generator().manual_seed(1))
    with pytest.raises(CaptureError, match=r"sample \(Sampler\): aten\.randn\.generator draws from the model's own "
                                           r"torch\.Generator.*generator=None"):
        capture(model, (torch.randn(5, 6),), method="export")


class Top1Router(torch.nn.Module):
    """Switch Transformers' router: it converts its own classifier to the router's dtype in forward."""

    def __init__(self, dim=6, experts=3):
        super().__init__()
        self.classifier = torch.nn.Linear(dim, experts, bias=False)
        self.dtype = torch.float32

    def forward(self, x):
        self.classifier = self.classifier.to(self.dtype)
        return self.classifier(x.to(self.dtype)).softmax(-1)


class TinyMoE(torch.nn.Module):
    def __init__(self, dim=6, experts=3):
        super().__init__()
        self.router = Top1Router(dim, experts)
        self.experts = torch.nn.ModuleList(torch.nn.Linear(dim, dim) for _ in range(experts))

    def forward(self, x):
        p = self.router(x).to(x.dtype)
        return sum(p[:, i:i + 1] * e(x) for i, e in enumerate(self.experts))


def test_a_module_converting_its_own_submodule_in_forward_is_exported():
    torch.manual_seed(0)
    model, x = TinyMoE(), torch.randn(5, 6)
    weight = model.router.classifier.weight
    g = capture(model, (x,), method="export")
    assert g.source == "torch.export" and not any("torch.fx" in note for note in g.notes)
    assert model.router.classifier.weight is weight                      # the model is left as it was
    # checked as captured: a float64 copy is another model here (its router casts to float32)
    cmp = check_plan(model, (x,), batch_split_plan(g), g, check_dtype="float32")
    assert cmp.passed, cmp.describe()


def test_a_conversion_in_forward_that_changes_the_dtype_is_a_cast_in_the_graph():
    """In float64 the router's ``.to(float32)`` converts: eager converts the parameters themselves
    (their gradients float32), the graph casts them, and both train alike."""
    torch.manual_seed(0)
    model, x = TinyMoE().double(), torch.randn(5, 6, dtype=torch.float64)
    g = capture(model, (x,), method="export")
    assert model.router.classifier.weight.dtype == torch.float64          # capture converted nothing
    assert g[g.params["router.classifier.weight"].owner].op.startswith("aten.to")
    cmp = check_plan(model, (x,), batch_split_plan(g), g, check_dtype="float32")
    assert cmp.passed, cmp.describe()
