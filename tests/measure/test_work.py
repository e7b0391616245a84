"""The work each call records (tensoropt.measure.costmodel.Work): FLOPs counted by
FlopCounterMode and bytes touched, checked against figures worked by hand; and untimed profiles
(``profile(..., timed=False)``): the same work, no times."""

import pytest
import torch

import tensoropt
from tensoropt.measure import CostModel, profile
from tensoropt.measure.costmodel import Work

B, IN, OUT, HIDDEN = 8, 64, 32, 16          # batch, Linear(64, 32), the second Linear(32, 16)
VOCAB, DIM, SEQ = 1000, 16, 4               # Embedding(1000, 16) looked up with 8 x 4 ids
F32, I64 = 4, 8                             # bytes per element


class Mixed(torch.nn.Module):
    """x (8, 64) -> Linear(64, 32) -> LayerNorm(32) -> Linear(32, 16), plus the mean of an
    Embedding(1000, 16) lookup of ids (8, 4)."""

    def __init__(self):
        super().__init__()
        self.first = torch.nn.Linear(IN, OUT)
        self.norm = torch.nn.LayerNorm(OUT)
        self.second = torch.nn.Linear(OUT, HIDDEN)
        self.embed = torch.nn.Embedding(VOCAB, DIM)

    def forward(self, x, ids):
        return self.second(self.norm(self.first(x))) + self.embed(ids).mean(1)


@pytest.fixture(scope="module")
def graph():
    torch.manual_seed(0)
    return tensoropt.capture(Mixed(), (torch.randn(B, IN), torch.randint(0, VOCAB, (B, SEQ))))


@pytest.fixture(scope="module")
def untimed(graph):
    return profile(graph, timed=False, repeats=1, cache=False, shard_degrees=(2,))


def node(graph, costs, op, index=0):
    return costs[[n.name for n in graph.ops if n.op == op][index]]


def test_the_first_linear_computes_no_input_gradient(graph, untimed):
    """Its input is the graph input: the backward is the weight gradient alone (2*B*in*out, not 4*)."""
    first = node(graph, untimed, "aten.linear.default", 0)
    # forward 2*8*64*32 = 32768; backward dW = dY^T x: the same again
    # bytes forward: x 8*64*4 + W 32*64*4 + b 32*4 + y 8*32*4 = 2048 + 8192 + 128 + 1024
    # bytes backward: dY 1024 + saved x 2048 + dW 8192 + db 128
    assert first.work == Work(fp_flops=2 * B * IN * OUT, bp_flops=2 * B * IN * OUT,
                              fp_bytes=11392, bp_bytes=11392)
    assert first.flops == first.work.fp_flops == 32768


def test_a_later_linear_computes_both_gradients(graph, untimed):
    """Its input needs a gradient: the backward is dX and dW, twice the forward's FLOPs."""
    second = node(graph, untimed, "aten.linear.default", 1)
    # forward 2*8*32*16 = 8192, backward 4*8*32*16 = 16384
    # bytes forward: x 1024 + W 2048 + b 64 + y 512 = 3648
    # bytes backward: dY 512 + saved x 1024 and W 2048 + dX 1024 + dW 2048 + db 64 = 6720
    assert second.work == Work(fp_flops=2 * B * OUT * HIDDEN, bp_flops=4 * B * OUT * HIDDEN,
                               fp_bytes=3648, bp_bytes=6720)
    # its batch shard (4 rows) does half the FLOPs: 2*4*32*16 = 4096 forward
    shard = second.shards[("batch", 2)]
    assert shard.work.fp_flops == 2 * (B // 2) * OUT * HIDDEN and shard.work.bp_flops == 4 * (B // 2) * OUT * HIDDEN


def test_a_layer_norm_counts_bytes_not_flops(graph, untimed):
    """FlopCounterMode counts no FLOPs for a layer norm; its forward moves x, weight, bias and y."""
    ln = node(graph, untimed, "aten.layer_norm.default")
    assert ln.work.fp_flops == 0 and ln.work.bp_flops == 0
    assert ln.work.fp_bytes == B * OUT * F32 + 2 * OUT * F32 + B * OUT * F32     # 1024 + 256 + 1024
    assert ln.work.bp_bytes > 0


def test_an_embedding_reads_the_rows_it_gathers_not_the_table(graph, untimed):
    """Forward bytes of a lookup: the 8*4 rows read, the ids and the output — not 1000*16 floats."""
    emb = node(graph, untimed, "aten.embedding.default")
    rows = B * SEQ * DIM * F32         # 2048: the rows gathered
    ids = B * SEQ * I64                # 256
    out = B * SEQ * DIM * F32          # 2048
    assert emb.work.fp_bytes == rows + ids + out == 4352
    assert emb.work.fp_bytes < VOCAB * DIM * F32
    assert emb.work.fp_flops == 0


def test_an_untimed_profile_has_no_times(graph, untimed):
    """timed=False: settings say so, and every time, whole or shard, is 0."""
    assert untimed.settings["timed"] is False
    assert untimed.settings["in_sequence"]["used"] is False
    for n in untimed.nodes.values():
        assert n.fp_s == 0.0 and n.bp_s == 0.0
        assert all(s.fp_s == 0.0 and s.bp_s == 0.0 for s in n.shards.values())
    assert "peak_flops" not in untimed.device       # no device peaks measured either


def test_a_timed_profile_records_the_same_work(graph, untimed):
    """Timing changes the times, not the work."""
    timed = profile(graph, repeats=1, warmup=0, cache=False, shard_degrees=(2,), in_sequence=False)
    assert timed.settings["timed"] is True
    assert set(timed.nodes) == set(untimed.nodes)
    for name, n in timed.nodes.items():
        assert n.work == untimed[name].work, name
        assert {k: s.work for k, s in n.shards.items()} == {k: s.work for k, s in untimed[name].shards.items()}
        if n.method != "free":
            assert n.fp_s > 0


def test_work_survives_the_profile_file(graph, untimed, tmp_path):
    """Saved and loaded, a profile keeps every call's work and its untimed flag."""
    path = tmp_path / "profile.json"
    untimed.save(path)
    back = CostModel.load(path, graph)
    assert back.settings["timed"] is False
    for name, n in untimed.nodes.items():
        assert back[name].work == n.work
        assert {k: s.work for k, s in back[name].shards.items()} == {k: s.work for k, s in n.shards.items()}


def test_a_shards_entry_in_the_file_is_every_field_of_the_shard(untimed):
    """The profile file's shard entries are ``dataclasses.asdict`` of each shard, in field order
    (written field by field for speed: the same dict)."""
    import dataclasses

    for n in untimed.nodes.values():
        assert n.to_dict()["shards"] == [{"layout": lay, "degree": k, **dataclasses.asdict(s)}
                                         for (lay, k), s in n.shards.items()]
        assert [list(e) for e in n.to_dict()["shards"]] == [["layout", "degree", *(f.name for f in
                                                              dataclasses.fields(s))] for s in n.shards.values()]
    assert any(n.shards for n in untimed.nodes.values())


def test_a_fused_lstm_records_the_flops_of_its_matrix_products():
    """FlopCounterMode counts nothing for a fused LSTM kernel; the profiler counts its GEMMs: each
    of the 2 layers has W_ih (4·32 × 16 for the first, 4·32 × 32 for the second) and W_hh
    (4·32 × 32), each applied to every one of the 3 × 5 tokens: 2 · 15 · 128 · (16 + 32 + 32 + 32)."""

    class Lstm(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = torch.nn.LSTM(16, 32, num_layers=2, batch_first=True)

        def forward(self, x):
            return self.rnn(x)[0]

    torch.manual_seed(0)
    graph = tensoropt.capture(Lstm(), (torch.randn(3, 5, 16),))
    costs = tensoropt.profile(graph, shard_degrees=(1,), timed=False, cache=False)
    (lstm,) = [n for n in costs.nodes.values() if "lstm" in n.op.lower()]
    assert lstm.work.fp_flops == 2 * 15 * 128 * (16 + 32 + 32 + 32)
    assert lstm.work.bp_flops == 2 * lstm.work.fp_flops


@pytest.mark.parametrize("causal", [False, True])
def test_fused_attention_records_the_flops_of_its_products(causal):
    """FlopCounterMode counts nothing for the CPU's fused attention; the profiler counts as PyTorch
    does the CUDA kernels: forward Q·Kᵀ and P·V, 2·b·h·s²·d each; backward five such products (the
    scores recomputed, dV, dP, dQ, dK).  Batch 3, 4 heads, 16 tokens, head size 8.  Causal: a flash
    kernel computes 16·17/2 of the 16² query-key pairs."""

    class Attention(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = torch.nn.Linear(32, 96)

        def forward(self, x):
            q, k, v = self.qkv(x).view(3, 16, 3, 4, 8).permute(2, 0, 3, 1, 4)
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)

    graph = tensoropt.capture(Attention(), (torch.randn(3, 16, 32),))
    costs = tensoropt.profile(graph, shard_degrees=(1,), timed=False, cache=False)
    (attention,) = [n for n in costs.nodes.values() if "attention" in n.op]
    product = 2 * 3 * 4 * 16 * 16 * 8
    pairs = (16 * 17 // 2) / 16**2 if causal else 1
    assert attention.work.fp_flops == 2 * product * pairs
    assert attention.work.bp_flops == 5 * product * pairs
