"""Architecture rules of src/pearl, checked from the source with `ast` (nothing is imported):

- no import cycle between modules;
- imports go down the layer table below (a module imports only its own layer or lower ones);
- every module is in a layer;
- no file in src/ has more than MAX_FILE_LINES lines;
- no function or method in src/ is longer than MAX_FUNCTION_LINES lines, unless the line right above
  its `def` (or above its first decorator) is a comment containing `long:` and a reason.

Every `import` and `from ... import` counts: at module level, inside functions, and under
`if TYPE_CHECKING:`. `from pkg import name` is an edge to `pkg.name` when that is a module, else to
`pkg`; importing `a.b.c` is an edge to `a.b.c` only (not to the packages `a`, `a.b` above it).
"""
from __future__ import annotations

import ast
import re
from pathlib import Path


SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "pearl"

# The layers, lowest first. `pkg.*` covers the package `pkg` (its __init__) and every module under it;
# a plain name covers that module only and wins over any `.*` entry; among `.*` entries the longest
# wins. docs/architecture.md ("Layers") must show the same table: change both together.
LAYERS: list[tuple[str, list[str]]] = [
    ("values", ["pearl.types", "pearl.errors", "pearl.config", "pearl.config_estimate", "pearl.config_admission",
                "pearl.config_schedule", "pearl.config_layout", "pearl.config_twin", "pearl.config_io"]),
    ("model", ["pearl.perf.*"]),
    ("bookkeeping", ["pearl.kv.*", "pearl.engine.request", "pearl.engine.chunks", "pearl.engine.scheduler",
                     "pearl.engine.router",
                     "pearl.workloads", "pearl.control.state", "pearl.control.staleness"]),
    # pearl.engine (the package __init__) sits with its highest module, the emulated engine.
    ("engines", ["pearl.engine", "pearl.engine.emulated", "pearl.real.*"]),
    ("control", ["pearl.control.*"]),  # predictor, selector, planner, switching, borrowing, lending, refit, ...
    ("rl", ["pearl.rl.*", "pearl.envs.*"]),
    ("runtimes", ["pearl.runtime.*", "pearl.report", "pearl.compare_plots"]),  # pearl.report reads the runtimes' files (trace.py)
    ("cli", ["pearl.cli", "pearl"]),  # "pearl" is the top package's __init__
]

MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 60
LONG_MARK = re.compile(r"#.*\blong:\s*\S")


# ---------------------------------------------------------------------------- reading the source

def module_files(src: Path = SRC, package: str = PACKAGE) -> dict[str, Path]:
    """Dotted module name -> file, for every module of `package` under `src`."""
    out = {}
    for path in sorted((src / package).rglob("*.py")):
        parts = path.relative_to(src).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _resolve(name: str, modules: set[str]) -> str | None:
    """The module an import of dotted `name` loads: `name` itself, else its longest prefix that is a
    module (`from pkg import attr` style); None when nothing of it is ours."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def imports_of(module: str, path: Path, modules: set[str], package: str = PACKAGE) -> list[tuple[str, int]]:
    """(imported module, line) for every import in `path` of a module of `package`, wherever it is."""
    is_pkg = path.name == "__init__.py"
    here = module if is_pkg else module.rpartition(".")[0]  # the package relative imports start from
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here.split(".")
                base = base[:len(base) - (node.level - 1)] if node.level > 1 else base
                base_name = ".".join(base + ([node.module] if node.module else []))
            else:
                base_name = node.module or ""
            # `from pkg import sub` loads pkg.sub when that is a module; otherwise it reads an
            # attribute of pkg.
            targets = [f"{base_name}.{a.name}" if f"{base_name}.{a.name}" in modules else base_name
                       for a in node.names]
        else:
            continue
        for t in targets:
            if t == package or t.startswith(package + "."):
                r = _resolve(t, modules)
                if r is not None and r != module:
                    out.append((r, node.lineno))
    return out


def import_graph(src: Path = SRC, package: str = PACKAGE) -> dict[str, dict[str, int]]:
    """module -> {imported module: first line importing it}."""
    files = module_files(src, package)
    graph: dict[str, dict[str, int]] = {}
    for mod, path in files.items():
        edges: dict[str, int] = {}
        for target, line in imports_of(mod, path, set(files), package):
            edges[target] = min(line, edges.get(target, line))
        graph[mod] = edges
    return graph


# ---------------------------------------------------------------------------- the rules

def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def layer_of(module: str, layers: list[tuple[str, list[str]]] = LAYERS) -> int | None:
    """1-based layer of `module`, or None when the table does not cover it."""
    for i, (_, patterns) in enumerate(layers, 1):
        if module in patterns:
            return i
    best, best_len = None, -1
    for i, (_, patterns) in enumerate(layers, 1):
        for p in patterns:
            if p.endswith(".*"):
                pkg = p[:-2]
                if (module == pkg or module.startswith(pkg + ".")) and len(pkg) > best_len:
                    best, best_len = i, len(pkg)
    return best


def layer_violations(graph: dict[str, dict[str, int]], files: dict[str, Path],
                     layers: list[tuple[str, list[str]]] = LAYERS) -> list[str]:
    out = []
    for mod in sorted(graph):
        lm = layer_of(mod, layers)
        for target, line in sorted(graph[mod].items()):
            lt = layer_of(target, layers)
            if lm is not None and lt is not None and lt > lm:
                out.append(f"{mod} ({layers[lm - 1][0]}, {lm}) imports {target} ({layers[lt - 1][0]}, {lt}) "
                           f"at {_rel(files[mod])}:{line}")
    return out


def long_functions(path: Path, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """`file:line name (n lines)` for every function longer than `limit` lines (its `def` line to its
    last line) not marked by a `# long: <why>` comment right above its `def` or first decorator."""
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    out = []
    for node in ast.walk(ast.parse(text, str(path))):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        n = node.end_lineno - node.lineno + 1
        if n <= limit:
            continue
        first = min([node.lineno] + [d.lineno for d in node.decorator_list])
        above = {first - 1, node.lineno - 1}  # 1-based numbers of the lines that may carry the mark
        if any(1 <= k <= len(lines) and lines[k - 1].lstrip().startswith("#") and LONG_MARK.search(lines[k - 1])
               for k in above):
            continue
        out.append(f"{_rel(path)}:{node.lineno} {node.name} ({n} lines)")
    return out


def _rel(path: Path) -> str:
    try:
        return str(path.relative_to(SRC.parent))
    except ValueError:
        return str(path)


# ---------------------------------------------------------------------------- tests of the tree

def test_no_import_cycles():
    graph = import_graph()
    found = cycles(graph)
    lines = []
    for comp in found:
        members = set(comp)
        edges = [f"    {m} -> {t} (line {graph[m][t]})" for m in comp for t in sorted(graph[m]) if t in members]
        lines.append("cycle among " + ", ".join(comp) + ":\n" + "\n".join(edges))
    assert not found, f"{len(found)} import cycle(s):\n" + "\n".join(lines)


def test_every_module_is_in_a_layer():
    missing = [m for m in module_files() if layer_of(m) is None]
    assert not missing, "modules in no layer (add them to a layer in LAYERS and docs/architecture.md): " + \
        ", ".join(missing)


def test_imports_follow_the_layers():
    bad = layer_violations(import_graph(), module_files())
    assert not bad, f"{len(bad)} import(s) against the layer order:\n" + "\n".join(bad)


def test_no_file_is_too_long():
    bad = []
    for path in sorted(SRC.rglob("*.py")):
        n = len(path.read_text(encoding="utf-8").splitlines())
        if n > MAX_FILE_LINES:
            bad.append(f"{_rel(path)}: {n} lines")
    assert not bad, f"files over {MAX_FILE_LINES} lines:\n" + "\n".join(bad)


def test_no_function_is_too_long():
    bad = [f for path in sorted(SRC.rglob("*.py")) for f in long_functions(path)]
    assert not bad, (f"functions over {MAX_FUNCTION_LINES} lines (split them, or put `# long: <why>` on "
                     "the line above the def or its first decorator):\n" + "\n".join(bad))


# ---------------------------------------------------------------------------- tests of the checker

def test_layer_table_is_well_formed():
    seen: dict[str, str] = {}
    for name, patterns in LAYERS:
        for p in patterns:
            assert p not in seen, f"{p} is in both {seen[p]} and {name}"
            seen[p] = name
    assert layer_of("pearl.control.state") == 3 and layer_of("pearl.control.borrowing") == 5
    assert layer_of("pearl.control") == 5 and layer_of("pearl.perf") == 2 and layer_of("pearl") == 8
    assert layer_of("pearl.real.engine") == 4 and layer_of("pearl.nowhere") is None


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return tmp_path


def test_checker_sees_every_kind_of_import(tmp_path):
    src = _tree(tmp_path, {
        "pk/__init__.py": "",
        "pk/a.py": "import os\nimport pk.b as bee\n",
        "pk/b.py": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pk.sub.c import X\n"
                    "def f():\n    from . import d\n    return d\n"),
        "pk/sub/__init__.py": "from .c import X\nfrom .. import e\n",
        "pk/sub/c.py": "from ..d import Y\nfrom pk.sub import thing\nX = 1\n",
        "pk/d.py": "import pk\nfrom pk import e\nY = 2\n",
        "pk/e.py": "",
    })
    g = import_graph(src, "pk")
    assert g == {"pk": {}, "pk.a": {"pk.b": 2}, "pk.b": {"pk.sub.c": 3, "pk.d": 5},
                 "pk.sub": {"pk.sub.c": 1, "pk.e": 2}, "pk.sub.c": {"pk.d": 1, "pk.sub": 2},
                 "pk.d": {"pk": 1, "pk.e": 2}, "pk.e": {}}
    assert cycles(g) == [["pk.sub", "pk.sub.c"]]
    assert cycles({"x": {"y": 1}, "y": {"z": 1}, "z": {"x": 1}, "w": {"x": 1}}) == [["x", "y", "z"]]


def test_checker_flags_upward_imports(tmp_path):
    layers = [("low", ["pk.low"]), ("high", ["pk.high", "pk"])]
    src = _tree(tmp_path, {"pk/__init__.py": "", "pk/low.py": "def f():\n    import pk.high\n",
                           "pk/high.py": "from pk import low\n"})
    files = module_files(src, "pk")
    bad = layer_violations(import_graph(src, "pk"), files, layers)
    assert len(bad) == 1 and bad[0].startswith("pk.low (low, 1) imports pk.high (high, 2) at ")
    assert bad[0].endswith("low.py:2")


def test_checker_long_function_mark(tmp_path):
    body = "".join(f"    x{i} = {i}\n" for i in range(60))  # def + 60 lines = 61 lines
    short = "".join(f"    x{i} = {i}\n" for i in range(59))  # 60 lines: allowed
    src = _tree(tmp_path, {
        "m.py": (f"def bare():\n{body}\n"
                 f"# long: one table, reads best in one piece\ndef marked():\n{body}\n"
                 f"# long: decorated\n@staticmethod\ndef decorated():\n{body}\n"
                 f"# long:\ndef no_reason():\n{body}\n"
                 f"def short():\n{short}\n")})
    found = long_functions(src / "m.py")
    assert [f.split()[1] for f in found] == ["bare", "no_reason"]
    assert found[0].endswith(":1 bare (61 lines)")

