"""The house's shape, checked against the code (issue 32): cct's modules import each other
without a cycle, and the floors of docs/ARCHITECTURE.md's diagram only call downward. Imports
are read from the source (ast), those inside functions included (a lazy import is still an
arrow), those under ``if TYPE_CHECKING:`` left out (they never run)."""
import ast
import pathlib
import re
from collections import defaultdict

import pytest

from .conftest import REPO

PACKAGE = REPO / "cct"
#: docs/ARCHITECTURE.md's floors, bottom to top ("The layers, bottom to top"), every top-level
#: module and package of cct/ on one. An arrow may go down, or across one floor, but never up;
#: the diagram's own floors (backend, layers, net, params, scheduler|solver, driver, optimizer,
#: cli) are the spine, the other rooms sit on the lowest floor whose rooms use them.
FLOORS = [
    # the ground: imports nothing of cct but the ground (native loads _C; caffe_alias makes
    # `import caffe` give cct, for Python layers and scripts)
    ("_C", "native", "errors", "glog", "heap", "install", "proto", "rng", "usage",
     "caffe_alias"),
    ("io",),            # Caffe's files, below all that read them (the backend's plan cache too)
    ("backend",),
    ("blob", "filler", "data_transformer", "layers"),
    ("net", "blob_memory"),
    ("params", "devices", "solver_rules", "context", "graphed"),
    ("scheduler", "solver"),
    ("driver",),
    ("optimizer",),
    # the pycaffe surface: what `import cct as caffe` gives
    ("api", "pycaffe", "net_spec", "coord_map", "classifier", "detector", "draw", "onnx_export"),
    ("cli", "flags", "progress", "tools", "__main__", "as_caffe"),
]
#: rooms of one floor that must not import each other: the solver knows nothing of schedulers.
APART = {frozenset(("scheduler", "solver"))}
#: modules that sit on another floor than their package: ``cct.io`` is also pycaffe's
#: ``caffe.io`` (its __init__ re-exports pycaffe_io, whose Transformer uses the data
#: transformer), as the package ``cct`` is pycaffe's ``caffe``.
PLACED = {"cct.io": "pycaffe", "cct.io.pycaffe_io": "pycaffe"}
#: back-arrows in code this change could not reach, each with the fix that removes it; the
#: test fails when one is fixed and still listed, so the set only shrinks.
KNOWN: set = set()     # none left: pycaffe's caffe.draw holds the drawing, the tool calls it


def _modules():
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(REPO).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    out["cct._C"] = None            # the compiled extension: a module, with no source to read
    return out


def _typing_only(tree):
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for stmt in node.body:
                skip.update(id(n) for n in ast.walk(stmt))
    return skip


def _targets(module, path, node, modules):
    """The cct modules an import statement names (a package's submodule when it names one)."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        base = node.module or ""
        if node.level:
            up = package.split(".")[:len(package.split(".")) - (node.level - 1)]
            base = ".".join(up + ([node.module] if node.module else []))
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                 for a in node.names]
    for name in names:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        if name.startswith("cct") and name != module:
            yield name


def import_graph():
    modules = _modules()
    edges = defaultdict(set)
    for module, path in modules.items():
        if path is None:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        skip = _typing_only(tree)
        for node in ast.walk(tree):
            if id(node) in skip or not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for target in _targets(module, path, node, modules):
                # a submodule reaching its own package's __init__ (the package's names) is
                # how Python loads it, not an arrow of the design
                if not module.startswith(target + "."):
                    edges[module].add(target)
    return modules, edges


def _cycles(nodes, edges):
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]
    for root in nodes:
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    component = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        component.append(w)
                        if w == v:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def _room(module):
    if module in PLACED:
        return PLACED[module]
    return module.split(".")[1] if "." in module else None


def _floor(module):
    room = _room(module)
    return next((i for i, rooms in enumerate(FLOORS) if room in rooms), None)


def test_no_import_cycle():
    modules, edges = import_graph()
    assert _cycles(sorted(modules), edges) == []


def _upward(edges):
    """Arrows to a higher floor, or between rooms kept apart on one floor."""
    return sorted((m, t) for m, targets in edges.items() for t in targets
                  if _floor(m) is not None and _floor(t) is not None
                  and (_floor(t) > _floor(m)
                       or frozenset((_room(m), _room(t))) in APART))


def test_every_room_has_a_floor():
    modules, _ = import_graph()
    assert sorted({m for m in modules if m != "cct" and _floor(m) is None}) == []


def test_the_floors_only_call_downward():
    _, edges = import_graph()
    assert set(_upward(edges)) - KNOWN == set()


def test_the_known_back_arrows_are_still_there():
    """A fixed back-arrow leaves KNOWN in the same change."""
    _, edges = import_graph()
    assert KNOWN - set(_upward(edges)) == set()


def test_the_extension_and_the_version_come_from_the_lowest_floor():
    """cct/native.py loads _C (after OpenBLAS's environment) and holds __version__; nothing
    else imports _C, and nothing imports the package itself, whose __init__ is the pycaffe
    surface at the top."""
    _, edges = import_graph()
    assert sorted(m for m, targets in edges.items() if "cct._C" in targets) == ["cct.native"]
    assert sorted(m for m, targets in edges.items() if "cct" in targets) == []
    assert {t for t in edges["cct.native"]} == {"cct._C"}


def test_the_architecture_page_names_these_floors_in_this_order():
    """The diagram drawn in docs/ARCHITECTURE.md is the one checked above: read bottom to top,
    each room is named once, a row names rooms of one floor, and no room sits below a room of
    a lower floor."""
    text = (REPO / "docs" / "ARCHITECTURE.md").read_text()
    diagram = text.split("## The layers, bottom to top", 1)[1].split("```")[1]
    rows = [line for line in diagram.splitlines() if line.strip()]
    floor_of = {room: i for i, rooms in enumerate(FLOORS) for room in rooms}
    order = []
    for line in reversed(rows):          # bottom to top
        # a room's label: the word, then a gap, a "(" or the line's end ("the solver rules"
        # in the backend's line is prose, not a label)
        named = [room for room in floor_of
                 if re.search(rf"(^|\s){re.escape(room)}(\s{{2,}}|\s*\(|$)", line)]
        assert len({floor_of[room] for room in named}) <= 1, line
        order += named
    assert sorted(order) == sorted(floor_of)
    assert [floor_of[room] for room in order] == sorted(floor_of[room] for room in order)


def test_the_checker_sees_a_cycle_an_upward_arrow_and_a_lazy_import():
    edges = {"cct.a": {"cct.b"}, "cct.b": {"cct.c"}, "cct.c": {"cct.a"}, "cct.d": {"cct.a"}}
    assert _cycles(["cct.a", "cct.b", "cct.c", "cct.d"], edges) == [["cct.a", "cct.b", "cct.c"]]
    assert _upward({"cct.net": {"cct.layers.conv", "cct.solver"},
                    "cct.scheduler": {"cct.solver"}, "cct.driver.store": {"cct.params"},
                    "cct.io.weights": {"cct.blob"}, "cct.blob": {"cct.filler"},
                    "cct.io.atomic": {"cct.io.pycaffe_io"}}) == [
        ("cct.io.atomic", "cct.io.pycaffe_io"),
        ("cct.io.weights", "cct.blob"), ("cct.net", "cct.solver"),
        ("cct.scheduler", "cct.solver")]
    modules, graph = import_graph()
    # cct/backend/cpu.py imports the array kernels inside a function: still an arrow
    assert "cct.backend.array_kernels" in graph["cct.backend.cpu"]


if __name__ == "__main__":
    pytest.main([__file__])
