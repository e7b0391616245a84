"""Is a frontier point's memory the truth, and is the frontier the Pareto set by it?

Two tables:

1. **Zoo models**: for every frontier point of each model on a preset, its memory against
   :func:`tensoropt.simulate`'s peak for its plan (one memory walk: they must be equal), and the
   search's additive estimate against the walked peak over every plan the search offered
   (the error the polish makes up for).
2. **Brute force**: small models on 2 and 4 devices, times drawn from ``--seeds`` seeds (as
   ``tests/frontier/test_peak.py``): every plan of the mesh enumerated and walked, its Pareto set
   by (walked peak, time) against the frontier — exactly equal or not, with and without the
   polish (``max_walks=0`` stops it at the search's candidates).

    python benchmarks/frontier_memory.py [--preset titan-rtx-5] [--seeds 25] [--models zoo:…,zoo:…]

It reports the gaps it finds: it must not change the search's settings beyond those named above.
"""

from __future__ import annotations

import argparse
import importlib.util
import pathlib
import sys

import numpy as np
import torch

import tensoropt
from tensoropt.frontier import track_frontier

ROOT = pathlib.Path(__file__).resolve().parents[1]
DEFAULT_MODELS = ("zoo:vgg16?tiny=1,zoo:gpt2?layers=2&batch=4&seq_len=32&hidden=64&heads=4&vocab=512,"
                  "zoo:wide_resnet?tiny=1,zoo:transformer?tiny=1,zoo:unet?tiny=1")


def _test_module():
    spec = importlib.util.spec_from_file_location("test_peak", ROOT / "tests/frontier/test_peak.py")
    mod = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(ROOT / "tests"))
    spec.loader.exec_module(mod)
    return mod


def zoo_table(models: list[str], preset: str, optimizer: str) -> None:
    print("| model | ops | points | frontier vs simulator, largest gap | estimate / walked peak (plans) | s |")
    print("|---|---:|---:|---:|---:|---:|")
    for spec in models:
        result = tensoropt.explore(tensoropt.Request(spec, preset, optimizer=optimizer, repeats=1))
        graph, costs, cluster, fr, took = result.graph, result.costs, result.cluster, result.frontier, \
            result.seconds["frontier"]
        gap = max(abs(p.memory_bytes - tensoropt.simulate(p.plan, graph, costs, cluster, optimizer=optimizer)
                      .max_memory_bytes) / p.memory_bytes for p in fr)
        cand = np.concatenate([m.candidate_costs for m in fr.meshes])
        ratio = cand[:, 0] / cand[:, 1]
        print(f"| {spec} | {len(graph.ops)} | {len(fr)} | {gap * 100:.3f} % | "
              f"{ratio.min():.2f}–{ratio.max():.2f} ({len(cand)}) | {took:.1f} |", flush=True)


def brute_table(seeds: int, optimizer: str) -> None:
    tp = _test_module()
    from conftest import TiedLM  # here, not at the top: importable once _test_module put tests/ on the path

    torch.manual_seed(0)
    small = {"TinyMLP": (tp.TinyMLP(), (torch.randn(8, 8),)), "TiedLM": (TiedLM(), (torch.randint(0, 50, (4, 7)),))}
    print("\n| model | devices | plans | instances | exact, search only | exact, polished "
          "| largest miss, search only |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, (model, inputs) in small.items():
        graph = tensoropt.capture(model, inputs)
        measured = tensoropt.profile(graph, shard_degrees=(1, 2, 4), repeats=1)
        for mesh in (["gpu0", "gpu1"], ["gpu0", "gpu1", "gpu2", "gpu3"]):
            exact = {0: 0, None: 0}
            miss, n = 0.0, 0
            for seed in range(seeds):
                costs = tp.with_times(measured, seed)
                for walks in (0, None):
                    kw = {} if walks is None else {"max_walks": walks}
                    fr = track_frontier(graph, costs, tp.TITAN, meshes=[mesh], resolution=0, optimizer=optimizer, **kw)
                    want, n = tp.walked_pareto(graph, costs, fr.meshes[0].problem, optimizer)
                    got = sorted((float(p.memory_bytes), p.time_s) for p in fr)
                    same = [m for m, _ in got] == [m for m, _ in want] and np.allclose(
                        [t for _, t in got], [t for _, t in want], rtol=1e-12)
                    exact[walks] += same
                    if walks == 0:   # how much more memory the best reported plan at no more time needs
                        for m, t in want:
                            fits = [m2 for m2, t2 in got if t2 <= t * (1 + 1e-12)]
                            miss = max(miss, (min(fits) / m - 1) if fits else float("inf"))
            print(f"| {name} | {len(mesh)} | {n} | {seeds} | {exact[0]} | {exact[None]} | "
                  f"{'none' if miss == 0 else f'{miss * 100:+.1f} % memory'} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="titan-rtx-5")
    ap.add_argument("--models", default=DEFAULT_MODELS)
    ap.add_argument("--seeds", type=int, default=25)
    ap.add_argument("--optimizer", default="adamw")
    a = ap.parse_args()
    torch.set_num_threads(1)
    zoo_table(a.models.split(","), f"preset:{a.preset}", a.optimizer)
    brute_table(a.seeds, a.optimizer)


if __name__ == "__main__":
    main()
