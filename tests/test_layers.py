"""Imports flow one way: base values → capture → measuring and the cluster → the plan model →
search → execution → the workflow → the surfaces.  Read from the source (every import, those
inside functions too), so a new upward import fails here before it becomes a cycle."""

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "tensoropt"

#: the layers, lowest first; a module may import its own layer's modules and lower ones
LAYERS = [
    {"errors", "_io", "_kernels", "_malloc", "_procs", "optimizers", "graph", "plan", "layouts", "describe", "syncbn",
     "progress"},  # values
    {"capture", "modelspec", "zoo"},           # model → OpGraph
    {"measure", "cluster"},                    # what operators and links cost, measured
    {"devicemodel"},                           # operators priced on a device kind; costs meet a cluster
    {"planmodel"},                             # what a plan costs
    {"frontier", "placers"},                   # search
    {"execute", "distributed", "export"},      # a plan run: one process, one per rank, or a torchrun directory
    {"compare", "workflow"},                   # one request, every stage
    {"cli", "dashboard", "__init__"},          # surfaces (and every package's __main__, a program entry)
]
#: known upward imports, each with why it is still there (a new one is a failure)
KNOWN = {
    # capture records the keys of random draws with the executor's keyed-randomness module
    ("capture", "execute"),
}


def _module_files() -> dict[str, Path]:
    files = {}
    for p in ROOT.rglob("*.py"):
        parts = list(p.relative_to(ROOT).with_suffix("").parts)
        files[".".join(parts)] = p
    return files


def _type_only(tree: ast.AST) -> set[int]:
    """The ids of the nodes under ``if TYPE_CHECKING:``: imports for annotations only, never run."""
    guarded = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            guarded |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return guarded


def _imports(files: dict[str, Path]) -> dict[str, set[str]]:
    """module (dotted, relative to the package) → the package modules it imports when it runs
    (anywhere, inside functions too; not the annotation-only imports under ``TYPE_CHECKING``)."""
    out: dict[str, set[str]] = defaultdict(set)
    for name, path in files.items():
        here = name.split(".")[:-1]     # the module's package (for __init__, its own package)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        type_only = _type_only(tree)
        for node in ast.walk(tree):
            if id(node) in type_only:
                continue
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here[: len(here) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                elif (node.module or "").startswith("tensoropt"):
                    target = node.module.removeprefix("tensoropt").lstrip(".")
                else:
                    continue
                for alias in node.names:      # `from .. import syncbn`: the submodule itself
                    sub = f"{target}.{alias.name}".lstrip(".")
                    out[name].add(sub if sub in files or f"{sub}.__init__" in files else target)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("tensoropt."):
                        out[name].add(alias.name.removeprefix("tensoropt."))
    return out


def _top(module: str) -> str:
    if module.endswith("__main__"):
        return "cli"    # ``python -m PACKAGE``: a program entry is a surface, whichever package holds it
    return module.split(".")[0] if module else "__init__"


def test_imports_flow_one_way():
    rank = {n: i for i, layer in enumerate(LAYERS) for n in layer}
    files = _module_files()
    unknown_tops = {_top(m) for m in files} - set(rank)
    assert not unknown_tops, f"modules in no layer (add them to LAYERS): {sorted(unknown_tops)}"
    upward = set()
    for module, targets in _imports(files).items():
        for target in targets:
            a, b = _top(module), _top(target)
            if a != b and rank[b] > rank[a] and (a, b) not in KNOWN:
                upward.add(f"tensoropt.{module} imports tensoropt.{target}")
    assert not upward, "imports against the layers:\n" + "\n".join(sorted(upward))


def test_the_checker_sees_an_upward_import(tmp_path):
    """The check itself, on a made-up tree: measure importing the frontier is caught."""
    files = {"measure.profiler": tmp_path / "p.py", "frontier.track": tmp_path / "t.py"}
    files["measure.profiler"].write_text("from ..frontier.track import x\n")
    files["frontier.track"].write_text("from typing import TYPE_CHECKING\nfrom ..measure import profiler\n"
                                       "if TYPE_CHECKING:\n    from ..workflow import Request\n")
    imports = _imports(files)
    assert imports["measure.profiler"] == {"frontier.track"}
    assert imports["frontier.track"] == {"measure.profiler"}     # the annotation-only import is not one
