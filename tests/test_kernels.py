"""The search's kernels compiled ahead (tensoropt._kernels): what an install and the compiling
processes build is what a search calls, an install builds it without torch, and a warm cache or a
forked worker starts and waits for nothing."""

import importlib.util
import os
import pkgutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numba
import numpy as np

import tensoropt
import tensoropt._kernels as kernels
from tensoropt.planmodel.meshkernels import tiny_tables
from tensoropt.planmodel.meshplan import _tiny_evaluator

ROOT = Path(__file__).resolve().parents[1]

# What both tests in a process of their own (pytest in a subprocess) share: a tiny GPT-2 priced on
# V100s, a count of the kernels numba compiles (a kernel loaded from the cache is no compile), and
# searches that call every kernel.
SEARCHES = textwrap.dedent("""
    from numba.core import event

    import tensoropt
    import tensoropt._kernels as kernels
    from tensoropt.frontier import point_sets

    def tiny_gpt2():
        graph = tensoropt.load_model("zoo:gpt2?tiny=1").capture()
        cluster = tensoropt.load_cluster("preset:v100-8-nvlink")
        costs = tensoropt.price(tensoropt.profile(graph, shard_degrees=(1, 2, 4), repeats=1, timed=False), cluster,
                                costs_from="model").costs
        return graph, costs, cluster

    def count_compiles():
        ours = {id(d) for d in kernels.dispatchers()}
        compiled = []

        class Compiles(event.Listener):
            def on_start(self, ev):
                pass

            def on_end(self, ev):
                if id(ev.data["dispatcher"]) in ours:
                    compiled.append(ev.data["dispatcher"].py_func.__name__)

        event.register("numba:compile", Compiles())
        return compiled

    def search_everything(graph, costs, cluster):
        fr = tensoropt.track_frontier(graph, costs, cluster, devices=cluster.names[:4], workers=1)
        point_sets.PRUNE_MIN_CANDIDATES = 0   # every product through the pruned kernel too
        fr2 = tensoropt.track_frontier(graph, costs, cluster, devices=cluster.names[:4], workers=1)
        assert [p.time_s for p in fr] == [p.time_s for p in fr2]
        tensoropt.simulate(fr.min_time().plan, graph, costs, cluster)
""")

# A fresh install, as far as numba can tell (an empty cache folder): a model captured and profiled
# first (torch has run threads in this process), then the kernels compiled ahead, then searches.
# What a test of the suite did when the torch threads were found: the compiling processes' own tiny
# model's first operator waited forever (on a thread pool the fork did not copy) until ready()
# stopped them.
FRESH_INSTALL = SEARCHES + textwrap.dedent("""
    def test_fresh_install():
        graph, costs, cluster = tiny_gpt2()
        assert not kernels.cached()
        kernels.start()
        kernels.ready(timeout_s=100)   # they take 15-30 s; a stuck one is stopped at the limit
        assert kernels.cached(), "a compiling process was stopped, or its part misses a kernel"
        compiled = count_compiles()
        search_everything(graph, costs, cluster)
        assert compiled == [], f"compiled again: {sorted(set(compiled))}"
""")

# What the search does after an install compiled its kernels (setup.py): nothing compiled again,
# from the capture on.
AFTER_INSTALL = SEARCHES + textwrap.dedent("""
    def test_after_install():
        assert kernels.cached(), "the install left a kernel out of the cache"
        compiled = count_compiles()
        graph, costs, cluster = tiny_gpt2()
        kernels.start()
        assert kernels._pending == [], "a job started compiling after the install"
        search_everything(graph, costs, cluster)
        assert compiled == [], f"compiled again: {sorted(set(compiled))}"
""")


def _pytest_alone(tmp_path, name, source, env):
    """``source`` as ``tmp_path/name``, run by pytest in a process of its own with ``env``; asserts it passes."""
    (tmp_path / name).write_text(source)
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", "-o", "addopts=",
                          "--rootdir", str(tmp_path), str(tmp_path / name)],
                         env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert out.returncode == 0, out.stdout[-3000:]


def test_compiled_ahead_is_what_the_search_calls(tmp_path):
    _pytest_alone(tmp_path, "test_fresh_install.py", FRESH_INSTALL,
                  {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba")})


def _setup_module():
    """setup.py as a module (it calls setuptools only when run as a script)."""
    spec = importlib.util.spec_from_file_location("tensoropt_setup", ROOT / "setup.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_install_compiles_what_the_search_calls_without_torch(tmp_path):
    # the install's step (setup.py) in a process that refuses torch, into an empty cache; then a
    # search in a process of its own compiles nothing
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba")}
    build = subprocess.run([sys.executable, "-c", _setup_module().BUILD], cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=600)
    assert build.returncode == 0, build.stderr[-3000:]
    _pytest_alone(tmp_path, "test_after_install.py", AFTER_INSTALL, env)


def test_an_install_that_cannot_compile_goes_on(tmp_path, monkeypatch, capsys):
    # the step never fails the install: a build it cannot run says so, and the kernels compile at a job's start
    setup = _setup_module()
    monkeypatch.setattr(setup.sys, "executable", str(tmp_path / "no-such-python"))
    assert setup.compile_kernels(tmp_path) is False
    assert "a job's start compiles them" in capsys.readouterr().out


def test_the_kernels_modules_are_the_declared_ones():
    # build() imports MODULES only: a kernel declared elsewhere would be left to a job's start.  Every
    # module of the package imported first, so that every kernel is declared whatever ran before
    for module in pkgutil.walk_packages(tensoropt.__path__, "tensoropt."):
        if not module.name.endswith("__main__"):
            importlib.import_module(module.name)
    declared = {d.py_func.__module__ for d in kernels.dispatchers()} | {
        getattr(p, "func", p).__module__ for p in kernels.PARTS}
    assert declared == set(kernels.MODULES)


def test_the_saved_tiny_tables_have_the_evaluators_types():
    # the install compiles the evaluator's kernels on tiny_tables.npz: its entries must have the
    # argument types a real evaluator passes (else the search compiles anew); when this fails,
    # run tensoropt.planmodel.meshplan.write_tiny_tables()
    saved, now = tiny_tables(), _tiny_evaluator()._tables
    for table in ("walk", "time"):
        assert [numba.typeof(x) for x in saved[table]] == [numba.typeof(x) for x in now[table]], table
        assert all(isinstance(x, np.ndarray) == isinstance(y, np.ndarray) for x, y in zip(saved[table], now[table]))


def test_warm_cache_starts_nothing():
    kernels.start()   # compiles here only if this is the first search of a fresh clone
    kernels.ready()
    assert kernels.cached()
    kernels.start()
    assert kernels._pending == []
    kernels.ready()   # nothing to wait for


def test_a_fork_waits_for_nothing_of_its_parent(monkeypatch):
    # a worker forked while its parent's compiling processes ran copies their ids: it cannot wait for
    # another process's children, and must not try (os.waitpid would raise)
    monkeypatch.setattr(kernels, "_pending", [os.getpid() + 10_000_000])
    monkeypatch.setattr(kernels, "_owner", os.getpid() + 1)
    kernels.ready()
    assert kernels._pending == []


def test_a_compile_past_the_limit_is_stopped(monkeypatch):
    pid = os.fork()
    if pid == 0:   # a compiling process that never ends
        import time
        time.sleep(60)
        os._exit(0)
    monkeypatch.setattr(kernels, "_pending", [pid])
    monkeypatch.setattr(kernels, "_owner", os.getpid())
    kernels.ready(timeout_s=0.2)
    assert kernels._pending == []
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return
    raise AssertionError(f"process {pid} still there")


def test_load_brings_every_cached_kernel_into_this_process():
    kernels.start()
    kernels.ready()
    kernels.load()
    for d in kernels.dispatchers():   # each signature numba's cache holds, loaded (none compiled: it is cached)
        cached = {key[0] for key in d._cache._cache_file._load_index()}   # numba's index, read apart
        assert cached and cached <= set(d.overloads), d.py_func.__name__
    assert kernels.load() == 0   # all here already


def test_an_entry_of_another_machine_is_not_cached(monkeypatch):
    # an index entry whose key numba would not accept here (another CPU's, say) is not a cached
    # kernel: cached() must not take it for one, and load() must not compile it in its place
    kernels.start()
    kernels.ready()
    d = kernels.dispatchers()[0]
    index = d._cache._cache_file._load_index()
    elsewhere = {(sig, ("riscv64-unknown-linux-gnu", "generic", ""), code): v for (sig, _, code), v in index.items()}
    monkeypatch.setattr(d._cache._cache_file, "_load_index", lambda: elsewhere)
    assert not kernels.cached()
    assert kernels._cached_signatures(d) == []
