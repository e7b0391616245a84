"""PyTorch's own reference for what FSDP2 holds per rank, on a model this machine cannot hold.

The way torchtitan estimated FSDP memory (its ``scripts/estimate/estimation.py``): build the
model on the ``meta`` device, wrap every decoder layer in ``checkpoint_wrapper`` (optional) and
``fully_shard`` it there, after joining a *fake* process group of ``ranks`` ranks (this process is
rank 0); then, under ``FakeTensorMode``, materialise the shards (``to_empty``), make the optimizer
and the batch, and run training steps under ``FSDPMemTracker``, PyTorch's tracker of every tensor
storage alive.  Fake tensors have shapes and no data, so Llama-3-8B on 8 ranks costs 20–80 s on
this shared 2-core machine and about 420 MiB resident; the shortened model 3–4 s.  The reference
is MemTracker's, not tensoropt's: nothing here feeds tensoropt's estimates, and the package never
imports this module.

    python benchmarks/fsdp_reference.py                      # the table (each case a fresh process)
    python benchmarks/fsdp_reference.py --cases short,short-fp32 --json out/fsdp.json
    python benchmarks/fsdp_reference.py --cross-check        # fake vs real gloo ranks, short model

From Python (a test puts the repository root on ``sys.path``, as pytest's ``pythonpath`` does)::

    from benchmarks.fsdp_reference import SHORT, fsdp_reference, llama_config
    r = fsdp_reference(llama_config(**SHORT), ranks=2, batch=2, seq_len=128, checkpoint=False)
    r["peak_bytes"], r["breakdown"]["Activation"]

What is sharded as its own unit follows torchtitan's ``apply_fsdp`` (``layout="torchtitan"``,
2026-02): the token embedding; every decoder layer; the final norm with the output layer, one
unit kept gathered after forward (it is the first thing backward needs); then the model itself
(its root unit holds no parameter left).  ``layout="blocks"`` is the end-2024 torchtitan that
produced its published 8B figures, and tensoropt's own ``fsdp`` recipe: every decoder layer (the
last kept gathered after forward in torchtitan), then the model, whose root unit holds the
embedding, the final norm and the output layer.

A step is torchtitan's: ``logits = model(ids)``; ``loss = cross_entropy(logits.flatten(0, 1)
.float(), labels.flatten(0, 1))`` (the logits upcast to fp32, labels random ids, no shift);
``del logits``; ``loss.backward()``; ``clip_grad_norm_(max_norm=1, foreach=True)``;
``opt.step()``; ``opt.zero_grad()``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

# Llama-3-8B as published (Meta's config.json for Meta-Llama-3-8B): untied embeddings, RoPE
# theta 500 000, RMSNorm eps 1e-5, grouped-query attention with 8 KV heads.
LLAMA3_8B: dict[str, Any] = {
    "vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "rope_theta": 500000.0, "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False, "max_position_embeddings": 8192,
}
# the same architecture shortened for a CI test: seconds on this machine
SHORT: dict[str, Any] = {
    **LLAMA3_8B, "vocab_size": 1024, "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
    "num_attention_heads": 8, "num_key_value_heads": 2, "max_position_embeddings": 128,
}

#: FSDPMemTracker's categories (``_FSDPRefType``), in the order it reports them
CATEGORIES = ("Sharded Param", "Unsharded Param", "Buffer", "Sharded Grad", "Unsharded Grad", "Activation",
              "Temp", "All Gather", "Reduce Scatter", "OptState", "Inputs")
#: the categories grouped the way a memory model usually splits a step
GROUPS = {
    "parameters": ("Sharded Param", "Unsharded Param"),
    "gradients": ("Sharded Grad", "Unsharded Grad"),
    "optimizer state": ("OptState",),
    "activations": ("Activation",),
    "temporaries": ("Temp",),
    "collective buffers": ("All Gather", "Reduce Scatter"),
    "inputs and buffers": ("Inputs", "Buffer"),
}
LAYOUTS = ("torchtitan", "blocks")
OPTIMIZER_IMPLS = ("foreach", "fused", "for-loop")
GIB = 2 ** 30


def llama_config(**fields: Any) -> Any:
    """A ``transformers.LlamaConfig`` from plain fields (``rope_theta`` goes where transformers 5
    keeps it, ``rope_parameters``)."""
    from transformers import LlamaConfig

    fields = dict(fields)
    theta = fields.pop("rope_theta", 10000.0)
    return LlamaConfig(**fields, rope_parameters={"rope_type": "default", "rope_theta": theta})


def _causal_sdpa() -> str:
    """transformers' SDPA attention as a training step on an unpadded batch calls it, on real and
    fake tensors alike (:func:`tensoropt.zoo.hf.causal_attention`: +1 MiB of mask and repeated KV
    heads on the short model without it, measured against real gloo ranks)."""
    from tensoropt.zoo.hf import causal_attention

    return causal_attention()


def _selective_context() -> Any:
    """torchtitan's op-level selective activation checkpointing (``ac.mode="selective"``,
    ``selective_ac_option="op"``, end 2024): save the outputs of attention and of every other
    matmul, recompute the rest.  Its save list names the CUDA attention kernels; the CPU's flash
    kernel, what runs here, stands in for them."""
    from collections import defaultdict

    import torch
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    aten = torch.ops.aten
    save = {aten.mm.default, aten._scaled_dot_product_efficient_attention.default,
            aten._scaled_dot_product_flash_attention.default, aten._scaled_dot_product_flash_attention_for_cpu.default,
            torch.ops._c10d_functional.reduce_scatter_tensor.default, aten.abs.default, aten.max.default}
    counts: dict[str, int] = defaultdict(int)

    def policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
        key = "recompute" if ctx.is_recompute else "forward"
        if func == aten.mm.default:
            counts[key] += 1
        keep = func in save and not (func == aten.mm.default and counts[key] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def _decoder(model: Any) -> tuple[Any, Any, Any, Any]:
    """(embedding, decoder layers, final norm, output layer) of a Llama-like causal LM."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None or getattr(inner, "norm", None) is None or model.get_output_embeddings() is None:
        raise ValueError(f"{type(model).__name__} is not a Llama-like causal LM (model.model.layers, model.model.norm, "
                         "lm_head): build it from a LlamaConfig (llama_config) or a config of the same shape")
    return model.get_input_embeddings(), layers, inner.norm, model.get_output_embeddings()


def _breakdown(snapshot: dict) -> dict[str, int]:
    """FSDPMemTracker's per-device snapshot (one device: CPU) as {category name: bytes, "Total": bytes}."""
    if len(snapshot) != 1:
        raise ValueError(f"expected one device in the tracker's snapshot, got {list(snapshot)}")
    (dev_snap,) = snapshot.values()
    out = {getattr(k, "value", k): int(v) for k, v in dev_snap.items()}
    return {c: out.get(c, 0) for c in (*CATEGORIES, "Total")}


def fsdp_reference(config: Any, *, ranks: int, batch: int, seq_len: int, checkpoint: bool | str,
                   mixed_precision: bool = True, reshard_after_forward: bool = True, layout: str = "torchtitan",
                   optimizer_impl: str = "foreach", max_norm: float | None = 1.0, real: bool = False,
                   seed: int = 0) -> dict[str, Any]:
    """Per-rank memory of FSDP2 training a causal LM built from ``config``, by ``FSDPMemTracker``.

    ``ranks``: data-parallel (shard) degree; ``batch`` × ``seq_len``: token ids per rank.
    ``checkpoint``: ``checkpoint_wrapper`` (non-reentrant, no RNG state, as torchtitan) around
    every decoder layer: ``True`` / ``"full"`` recomputes the whole layer (torchtitan's
    ``ac.mode="full"``), ``"selective"`` keeps attention's and every other matmul's outputs
    (torchtitan's op-level selective AC, :func:`_selective_context`).  ``mixed_precision``:
    ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`` (torchtitan's default), else all
    fp32; the sharded parameters, gradients and AdamW's state are fp32 either way.
    ``reshard_after_forward=False``: no unit frees its gathered parameters after forward (ZeRO-2;
    torchtitan's ``reshard_after_forward="never"``).  ``layout``: which modules are units (see the
    module docstring).  ``optimizer_impl``: AdamW's implementation (torchtitan's end-2024 default
    ``foreach``: one parameter-sized temporary in the step; ``fused`` has none).  ``max_norm``:
    gradient clipping as torchtitan, ``None`` for none.

    ``real=False`` (the default): a fake process group of ``ranks`` ranks, this process rank 0 (the
    largest shard: FSDP pads each parameter's dim 0 to a multiple of ``ranks``, rank 0 is never
    short), and fake tensors: no data, any size.  ``real=True``: real tensors, in a process group
    already joined (``ranks`` must be its size): for checking the fake run against a real one.

    Two steps under one tracker, its peak restarted between them: the first step creates AdamW's
    state, the second holds what every later step does.  Returns ``peak_bytes`` and ``breakdown``
    (bytes per FSDPMemTracker category at that peak, and ``Total``) of the second step,
    ``first_step_peak_bytes`` and ``first_step_breakdown`` of the first, ``parameters`` (the
    model's count, unsharded), ``wall_s`` (this call), ``max_rss_bytes`` (this process's peak
    resident memory so far: ``ru_maxrss``) and the settings.  The fake run's bytes equal a real
    run's on 2 gloo ranks (``--cross-check``; docs/fsdp-reference.md).
    """
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from transformers import AutoModelForCausalLM

    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; known: {', '.join(LAYOUTS)}")
    if optimizer_impl not in OPTIMIZER_IMPLS:
        raise ValueError(f"unknown optimizer_impl {optimizer_impl!r}; known: {', '.join(OPTIMIZER_IMPLS)}")
    if checkpoint not in (False, True, "full", "selective"):
        raise ValueError(f"checkpoint must be False, True (= 'full') or 'selective', got {checkpoint!r}")
    if min(ranks, batch, seq_len) < 1:
        raise ValueError(f"ranks, batch and seq_len must be at least 1, got {ranks}, {batch}, {seq_len}")
    t0 = time.perf_counter()
    own_group = not real
    if real:
        if not dist.is_initialized() or dist.get_world_size() != ranks:
            raise ValueError(f"real=True runs in the process group already joined, of {ranks} ranks "
                             f"(joined: {dist.get_world_size() if dist.is_initialized() else 'none'})")
    else:
        if dist.is_initialized():
            raise ValueError("a process group is already joined: the fake run makes its own (call it in a fresh "
                             "process, or with real=True to measure in that group)")
        from torch.testing._internal.distributed.fake_pg import FakeStore

        dist.init_process_group("fake", rank=0, world_size=ranks, store=FakeStore())
    rng = torch.random.get_rng_state()   # the caller's random stream, given back (a test may rely on it)
    try:
        torch.manual_seed(seed)
        mesh = init_device_mesh("cpu", (ranks,))
        # fake: weights on meta (no memory); real: on the CPU with transformers' initial values
        with torch.device("meta" if not real else "cpu"):
            model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation=_causal_sdpa())
        embed, layers, norm, output = _decoder(model)
        parameters = sum(p.numel() for p in model.parameters())
        if checkpoint:
            # torchtitan's AC: ptd_checkpoint_wrapper(block, preserve_rng_state=False), non-reentrant
            context = {"context_fn": _selective_context} if checkpoint == "selective" else {}
            for i, layer in enumerate(layers):
                layers[i] = checkpoint_wrapper(layer, preserve_rng_state=False, **context)
        mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if mixed_precision
              else MixedPrecisionPolicy())
        kw = {"mesh": mesh, "mp_policy": mp}
        if layout == "torchtitan":
            fully_shard(embed, **kw, reshard_after_forward=reshard_after_forward)
            for layer in layers:
                fully_shard(layer, **kw, reshard_after_forward=reshard_after_forward)
            # the last unit forward runs is the first backward needs: never freed after forward
            fully_shard([norm, output], **kw, reshard_after_forward=False)
        else:
            for i, layer in enumerate(layers):
                fully_shard(layer, **kw, reshard_after_forward=reshard_after_forward and i < len(layers) - 1)
        fully_shard(model, **kw)   # the root: FSDP never frees its gathered parameters after forward
        model.train()

        fake = FakeTensorMode(allow_non_fake_inputs=True) if not real else None
        with fake if fake is not None else contextlib.nullcontext():
            if fake is not None:
                model.to_empty(device="cpu")
            # torchtitan's AdamW (lr 8e-4, weight decay 0.1); the implementation decides the step's temporaries
            impl = {"foreach": {"foreach": True}, "fused": {"fused": True}, "for-loop": {"foreach": False}}

            def adamw() -> torch.optim.Optimizer:
                return torch.optim.AdamW(model.parameters(), lr=8e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
                                         **impl[optimizer_impl])

            if fake is not None:
                # DTensor caches its sharding propagation per op and input layout; on a miss it builds the
                # output's metadata from global-shape tensors in the fake mode around it, which the tracker
                # then counts (AdamW's first step on the short model, 2 ranks: 36,077,272 bytes against
                # 16,401,112 on real gloo ranks).  An untracked clip and step of a throwaway optimizer on zero
                # gradients fills that cache with the very ops and layouts of the tracked steps.
                for p in model.parameters():
                    p.grad = torch.zeros_like(p)
                if max_norm is not None:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm, foreach=True)
                adamw().step()
                for p in model.parameters():
                    p.grad = None
            opt = adamw()
            ids = torch.randint(0, config.vocab_size, (batch, seq_len))
            labels = torch.randint(0, config.vocab_size, (batch, seq_len))
            # One tracker around both steps, as torchtitan's estimator: FSDPMemTracker swaps FSDP's forward
            # hooks for its own and, leaving, restores them per module, which breaks a unit of several modules
            # (fully_shard([norm, output]): one of them keeps the tracker's hook), so a second tracker cannot follow.
            tracker = FSDPMemTracker(model, opt)
            tracker.track_inputs((ids, labels))
            steps = []
            with tracker:
                for _ in range(2):
                    logits = model(input_ids=ids, use_cache=False).logits
                    loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(0, 1))
                    del logits   # torchtitan: "need to free to before bwd to avoid peaking memory"
                    loss.backward()
                    if max_norm is not None:
                        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm, foreach=True)
                    opt.step()
                    opt.zero_grad()
                    del loss
                    steps.append(_breakdown(tracker.get_tracker_snapshot("peak")))
                    # the next step's own peak: the module stats cleared (torchtitan) and the running peak
                    # restarted from what is alive now, as FSDPMemTracker.__enter__ starts it (private fields)
                    tracker.reset_mod_stats()
                    tracker._peak_mem_snap = tracker.get_tracker_snapshot()
                    tracker._peak_mem = {dev: snap["Total"] for dev, snap in tracker._peak_mem_snap.items()}
    finally:
        torch.random.set_rng_state(rng)
        if own_group:
            dist.destroy_process_group()
    return {
        "peak_bytes": steps[1]["Total"], "breakdown": steps[1],
        "first_step_peak_bytes": steps[0]["Total"], "first_step_breakdown": steps[0],
        "parameters": parameters,
        "wall_s": time.perf_counter() - t0,
        "max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,   # KiB on Linux
        "settings": {"ranks": ranks, "batch": batch, "seq_len": seq_len, "checkpoint": checkpoint,
                     "mixed_precision": mixed_precision, "reshard_after_forward": reshard_after_forward,
                     "layout": layout, "optimizer_impl": optimizer_impl, "max_norm": max_norm, "real": real,
                     "attn_implementation": model.config._attn_implementation},
    }



def real_rank(rt: Any, fields: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """One rank of a real run (a job for :func:`tensoropt.distributed.launch`): the same step on real
    tensors in the gloo group the launcher joined."""
    return fsdp_reference(llama_config(**fields), ranks=rt.world_size, real=True, **kwargs)


#: the cases the table shows: (model fields, fsdp_reference keywords)
_8B = {"ranks": 8, "batch": 2, "seq_len": 8192}
_SHORT = {"ranks": 2, "batch": 2, "seq_len": 128}
CASES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "8b": (LLAMA3_8B, {**_8B, "checkpoint": False}),
    "8b-ac": (LLAMA3_8B, {**_8B, "checkpoint": True}),
    "8b-sac": (LLAMA3_8B, {**_8B, "checkpoint": "selective"}),
    # the configuration of torchtitan's published end-2024 figure: its unit layout, op-level SAC, foreach AdamW
    "8b-sac-2024": (LLAMA3_8B, {**_8B, "checkpoint": "selective", "layout": "blocks"}),
    # the same on 128 ranks: torchtitan published both (82.4 GiB on 8 GPUs, 67.0 GiB on 128)
    "8b-sac-2024-128": (LLAMA3_8B, {**_8B, "ranks": 128, "checkpoint": "selective", "layout": "blocks"}),
    "8b-zero2": (LLAMA3_8B, {**_8B, "checkpoint": False, "reshard_after_forward": False}),
    "8b-blocks": (LLAMA3_8B, {**_8B, "checkpoint": False, "layout": "blocks"}),
    # tensoropt's fsdp+ac row (benchmarks/fsdp_truth.py)
    "8b-blocks-ac": (LLAMA3_8B, {**_8B, "checkpoint": True, "layout": "blocks"}),
    "8b-fused": (LLAMA3_8B, {**_8B, "checkpoint": False, "optimizer_impl": "fused"}),
    "short": (SHORT, {**_SHORT, "checkpoint": False}),
    "short-ac": (SHORT, {**_SHORT, "checkpoint": True}),
    "short-fp32": (SHORT, {**_SHORT, "checkpoint": False, "mixed_precision": False}),
    "short-fp32-ac": (SHORT, {**_SHORT, "checkpoint": True, "mixed_precision": False}),
}
DEFAULT_CASES = ("8b", "8b-ac", "8b-zero2", "short", "short-ac", "short-fp32", "short-fp32-ac")


def run_case(name: str, repeats: int = 1) -> dict[str, Any]:
    """One case of :data:`CASES` in ``repeats`` fresh interpreters (each its own ``ru_maxrss``, its own
    fake group): the first run's result with ``wall_s`` the median over runs, ``wall_s_runs`` and
    ``max_rss_bytes`` the largest; every run must report the same bytes."""
    runs = [_run_case_once(name) for _ in range(repeats)]
    for r in runs[1:]:
        if (r["breakdown"], r["first_step_breakdown"]) != (runs[0]["breakdown"], runs[0]["first_step_breakdown"]):
            raise RuntimeError(f"case {name}: runs disagree ({r['peak_bytes']:,} vs {runs[0]['peak_bytes']:,} bytes)")
    walls = [r["wall_s"] for r in runs]
    return {**runs[0], "wall_s": statistics.median(walls), "wall_s_runs": walls,
            "max_rss_bytes": max(r["max_rss_bytes"] for r in runs)}


def _run_case_once(name: str) -> dict[str, Any]:
    out = subprocess.run([sys.executable, __file__, "--one", name], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    if out.returncode != 0:
        raise RuntimeError(f"case {name} failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _cell(n: int) -> str:
    return f"{n:,} ({n / GIB:.2f})"


def table(results: dict[str, dict[str, Any]]) -> str:
    """Markdown: one row per FSDPMemTracker category at the peak of the second step, one column per
    case, bytes (GiB); then the groups, the first step's peak, time and the process's peak RSS."""
    names = list(results)
    lines = ["| bytes (GiB) | " + " | ".join(f"`{n}`" for n in names) + " |",
             "|---|" + "---:|" * len(names)]

    def row(label: str, values: list[str]) -> None:
        lines.append(f"| {label} | " + " | ".join(values) + " |")

    for c in CATEGORIES:
        row(c, [_cell(results[n]["breakdown"][c]) for n in names])
    row("**peak (step 2)**", [f"**{_cell(results[n]['peak_bytes'])}**" for n in names])
    for g, cats in GROUPS.items():
        row(f"= {g}", [_cell(sum(results[n]["breakdown"][c] for c in cats)) for n in names])
    row("peak (step 1)", [_cell(results[n]["first_step_peak_bytes"]) for n in names])
    row("parameters (count)", [f"{results[n]['parameters']:,}" for n in names])
    row("wall time (s, median)", [f"{results[n]['wall_s']:.1f}" for n in names])
    row("process peak RSS", [f"{results[n]['max_rss_bytes'] / 2 ** 20:,.0f} MiB" for n in names])
    return "\n".join(lines)


def cross_check(kinds: tuple[tuple[bool, bool | str], ...] = (
        (True, False), (True, True), (True, "selective"), (False, False), (False, True))) -> str:
    """The short model, fake (``ranks=2``) against real tensors on 2 gloo ranks, for each (mixed
    precision, checkpoint) of ``kinds``: the same tracker, the same step; a markdown table."""
    from tensoropt.distributed import launch

    lines = ["| bf16 MP | AC | fake peak | real rank 0 | real rank 1 | fake − real | categories that differ "
             "(fake / real rank 0) | step 1: fake / real rank 0 |", "|---|---|---:|---:|---:|---:|---|---|"]
    for mixed, ckpt in kinds:
        kw = {**_SHORT, "checkpoint": ckpt, "mixed_precision": mixed}
        fake = run_fields(SHORT, kw)
        real = launch("benchmarks.fsdp_reference:real_rank", 2,
                      {"fields": SHORT, **{k: v for k, v in kw.items() if k != "ranks"}}, timeout_s=600)
        differ = ", ".join(f"{c} {fake['breakdown'][c]:,} / {real[0]['breakdown'][c]:,}" for c in CATEGORIES
                           if fake["breakdown"][c] != real[0]["breakdown"][c]) or "none"
        lines.append(f"| {mixed} | {ckpt} | {fake['peak_bytes']:,} | {real[0]['peak_bytes']:,} | "
                     f"{real[1]['peak_bytes']:,} | {fake['peak_bytes'] - real[0]['peak_bytes']:+,} | {differ} | "
                     f"{fake['first_step_peak_bytes']:,} / {real[0]['first_step_peak_bytes']:,} |")
    return "\n".join(lines)


def run_fields(fields: dict[str, Any], kw: dict[str, Any]) -> dict[str, Any]:
    return fsdp_reference(llama_config(**fields), **kw)


ROOT = pathlib.Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default=",".join(DEFAULT_CASES),
                    help=f"comma-separated, of: {', '.join(CASES)} (default: %(default)s)")
    ap.add_argument("--repeats", type=int, default=1, help="fresh processes per case: median wall time (default 1)")
    ap.add_argument("--json", help="also write every case's result here")
    ap.add_argument("--cross-check", action="store_true",
                    help="the short model fake vs real on 2 gloo ranks, instead of the table")
    ap.add_argument("--one", help=argparse.SUPPRESS)   # a worker: one case, its JSON on stdout
    a = ap.parse_args()
    if a.one:
        fields, kw = CASES[a.one]
        print(json.dumps(run_fields(fields, kw)))
        return
    if a.cross_check:
        sys.path.insert(0, str(ROOT))   # the ranks import this module as benchmarks.fsdp_reference
        print(cross_check())
        return
    names = [n.strip() for n in a.cases.split(",") if n.strip()]
    unknown = [n for n in names if n not in CASES]
    if unknown:
        ap.error(f"unknown case(s) {', '.join(unknown)}; known: {', '.join(CASES)}")
    results = {}
    for n in names:
        results[n] = run_case(n, a.repeats)
        print(f"{n}: {results[n]['peak_bytes']:,} bytes ({results[n]['wall_s']:.0f} s)", file=sys.stderr, flush=True)
    print(table(results))
    if a.json:
        pathlib.Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        pathlib.Path(a.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
