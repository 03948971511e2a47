"""The package's layout, held to ARCHITECTURE.md: the import rule, no circle, the sizes.

The import graph is read from the source with ``ast``, no module imported: every ``import`` and
``from ... import`` inside ``nanoserve/``, at module level or inside a function, resolved to the
module it names (``from nanoserve.cpu import csrc`` is an edge to ``nanoserve.cpu.csrc``); an
import under ``if TYPE_CHECKING:`` is not an edge, since it never runs. The rule is the
``layers`` block of ARCHITECTURE.md, read from there, so the map and the test cannot drift
apart. The checks are plain functions of a graph, and the last tests feed them graphs with one
forbidden edge added to show that each would fail.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "nanoserve"
MAX_LINES = 400
MAX_ROOT_MODULES = 8


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def _type_checking(node: ast.If) -> bool:
    t = node.test
    return getattr(t, "id", None) == "TYPE_CHECKING" or getattr(t, "attr", None) == "TYPE_CHECKING"


def _targets(module: str, node: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]
    if node.level:
        parts = base.split(".")
        base = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module
                                                                 else []))
    else:
        base = node.module
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]


def imports_of(module: str, source: str) -> set[str]:
    """The nanoserve modules ``module`` imports, function-level imports included."""
    out: set[str] = set()

    def walk(node):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking(child):
                for c in child.orelse:
                    walk(c)
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                for t in _targets(module, child):
                    while t and t not in MODULES:  # an attribute of a module: the module
                        t = t.rpartition(".")[0]
                    if t and t != module:
                        out.add(t)
            walk(child)

    walk(ast.parse(source))
    return out


def import_graph() -> dict[str, set[str]]:
    return {m: imports_of(m, p.read_text()) for m, p in MODULES.items()}


def part(module: str) -> str:
    """``nanoserve.engine.core`` -> ``engine``; ``nanoserve.llm`` -> ``llm``."""
    names = module.split(".")
    return names[1] if len(names) > 1 else "nanoserve"


def read_layers() -> list[list[str]]:
    text = (ROOT / "ARCHITECTURE.md").read_text()
    block = re.search(r"```layers\n(.*?)```", text, re.S)
    assert block, "ARCHITECTURE.md has no ```layers block"
    return [line.split() for line in block[1].splitlines() if line.strip()]


def violations(graph: dict[str, set[str]], layers: list[list[str]]) -> list[str]:
    """Every edge against the rule: to the package's own ``__init__``, sideways to a part on
    the same line, or up to a part on a higher line."""
    level = {p: i for i, line in enumerate(layers) for p in line}
    bad = []
    for src, dsts in graph.items():
        for dst in sorted(dsts):
            a, b = part(src), part(dst)
            if dst == "nanoserve" and src != "nanoserve":
                bad.append(f"{src} -> {dst}: the package's __init__ is its face, not a layer")
            elif a == b or src == "nanoserve":
                continue
            elif level[b] == level[a]:
                bad.append(f"{src} -> {dst}: {a} and {b} share a line")
            elif level[b] < level[a]:
                bad.append(f"{src} -> {dst}: {b} sits above {a}")
    return bad


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


# ---------------------------------------------------------------------------- the package

@pytest.fixture(scope="module")
def graph():
    return import_graph()


def test_every_part_has_its_line_and_every_line_names_a_part():
    listed = [p for line in read_layers() for p in line]
    assert len(listed) == len(set(listed)), "a part is listed twice"
    actual = {part(m) for m in MODULES} - {"nanoserve"}
    assert set(listed) == actual


def test_no_import_goes_against_the_layers(graph):
    assert violations(graph, read_layers()) == []


def test_the_import_graph_has_no_circle(graph):
    assert circles(graph) == []


def test_at_most_eight_modules_sit_at_the_root():
    root = [p.name for p in PKG.glob("*.py") if p.name != "__init__.py"]
    assert len(root) <= MAX_ROOT_MODULES, sorted(root)


def test_no_module_is_over_400_lines():
    long = {m: n for m, p in MODULES.items() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def test_each_part_says_what_it_holds_and_what_it_may_import():
    for pkg in sorted(p for p in PKG.iterdir() if (p / "__init__.py").is_file()):
        doc = ast.get_docstring(ast.parse((pkg / "__init__.py").read_text())) or ""
        assert doc and "May import" in doc, f"nanoserve/{pkg.name}/__init__.py"


def test_the_attention_option_is_read_in_one_place():
    """No module but the selector compares anything named attention with a string: the cache,
    the engine and the loader hold a backend, never a name to branch on."""
    found = []
    for m, p in MODULES.items():
        if m == "nanoserve.attention.selector":
            continue
        src = p.read_text()
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, ast.Compare) and "attention" in ast.get_source_segment(src, node) \
                    and any(isinstance(c, ast.Constant) and isinstance(c.value, str)
                            for c in [node.left, *node.comparators]):
                found.append(f"{m}:{node.lineno}")
    assert found == []


def _attribute_chains(src: str) -> list[str]:
    """Every dotted chain read in ``src`` (``self.core.snapshot`` ...), as text."""
    out = []
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.Attribute):
            parts, n = [node.attr], node.value
            while isinstance(n, ast.Attribute):
                parts.append(n.attr)
                n = n.value
            if isinstance(n, ast.Name):
                out.append(".".join([n.id, *reversed(parts)]))
    return out


def test_the_front_doors_reach_only_the_cores_public_face():
    """``LLM`` and ``AsyncLLM`` call the core's public methods and read its snapshot and what
    it loaded; they never reach its engine, its scheduler or anything private."""
    from nanoserve.engine.core import EngineCore

    facts = {"loaded", "driver", "tokenizer", "max_model_len", "vocab_size", "eos_token_ids"}
    public = {n for n in dir(EngineCore) if not n.startswith("_")} | facts
    for name in ("llm.py", "async_engine.py"):
        for chain in _attribute_chains((PKG / name).read_text()):
            names = chain.split(".")
            if "core" in names[:-1]:
                used = names[names.index("core") + 1]
                assert used in public and used not in ("engine", "scheduler"), (name, chain)


def test_the_benchmarks_reach_no_private_name_elsewhere():
    for path in sorted((PKG / "bench").glob("*.py")):
        src = path.read_text()
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, ast.ImportFrom):
                assert not any(a.name.startswith("_") for a in node.names), (path.name, node.lineno)
        for chain in _attribute_chains(src):
            names = chain.split(".")
            private = [n for n in names[1:] if n.startswith("_") and not n.startswith("__")]
            assert not private or names[0] in ("self", "cls"), (path.name, chain)


def test_every_registry_line_names_a_class_of_its_own_part():
    """The registries name their classes as text (a config checks a name without importing a
    kernel), so no import edge shows where an entry points: each must name a class of the
    part that owns the registry, of the kind that part expects, under the name it is filed."""
    from nanoserve.attention.backends.base import AttentionBackend
    from nanoserve.config.registries import ATTENTION_BACKENDS, BATCHING_POLICIES, load_class
    from nanoserve.engine.scheduler import Scheduler
    from nanoserve.layers.linear import LinearMethod
    from nanoserve.layers.linear_methods import LINEAR_METHODS
    from nanoserve.model.registry import MODEL_FAMILIES

    for registry, owner, base in ((ATTENTION_BACKENDS, "nanoserve.attention.backends.",
                                   AttentionBackend),
                                  (BATCHING_POLICIES, "nanoserve.engine.", Scheduler),
                                  (LINEAR_METHODS, "nanoserve.layers.", LinearMethod),
                                  (MODEL_FAMILIES, "nanoserve.model.", object)):
        for name, path in registry.items():
            assert path.startswith(owner) and path.partition(":")[0] in MODULES, (name, path)
            cls = load_class(path)
            assert issubclass(cls, base), (name, path)
            assert getattr(cls, "name", name) == name, (name, path)


# ---------------------------------------------------------------------------- the checks fail

def test_an_upward_import_is_caught(graph):
    bad = {**graph, "nanoserve.config.model": graph["nanoserve.config.model"]
           | {"nanoserve.engine.core"}}
    assert violations(bad, read_layers()) == [
        "nanoserve.config.model -> nanoserve.engine.core: engine sits above config"]


def test_a_sideways_import_and_one_of_the_package_face_are_caught(graph):
    bad = {**graph, "nanoserve.cpu.fused": graph["nanoserve.cpu.fused"]
           | {"nanoserve.cuda.buckets", "nanoserve"}}
    assert violations(bad, read_layers()) == [
        "nanoserve.cpu.fused -> nanoserve: the package's __init__ is its face, not a layer",
        "nanoserve.cpu.fused -> nanoserve.cuda.buckets: cpu and cuda share a line"]


def test_a_circle_is_caught_even_inside_one_part(graph):
    bad = {**graph, "nanoserve.engine.request": graph["nanoserve.engine.request"]
           | {"nanoserve.engine.scheduler"}}
    assert any({"nanoserve.engine.request", "nanoserve.engine.scheduler"} <= set(c)
               for c in circles(bad))


def test_a_function_level_import_is_an_edge_and_a_type_checking_one_is_not():
    src = ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import nanoserve.llm\n"
           "def f():\n    from nanoserve.engine import core\n")
    assert imports_of("nanoserve.config.model", src) == {"nanoserve.engine.core"}
