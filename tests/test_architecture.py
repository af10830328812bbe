"""The package's structure, checked statically (``ast``, nothing imported): layers whose imports run one way.

Run as a script (``python tests/test_architecture.py``) for the report: the import cycles, the layer violations,
the function-local imports of tilefuse modules, the longest modules and the private names that cross modules.

Layers, lowest first (a module may import its own layer and those below it, at module level or in a function):
``util`` (config, fileio, progress) <- ``ir`` (ir, ops) <- ``planner`` <- ``lowering`` <- ``runtime`` <- ``api``
(pipeline, api, cli, backend, the package root); ``frontends`` turn torch/ONNX into the IR and sit beside the
planner (they import util and ir); ``models`` (the zoo) import nothing of the compiler.
"""

from __future__ import annotations

import ast
import os
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# package -> folder, as pyproject.toml's package-dir maps them
PACKAGES = {"tilefuse": "tilefuse", "tilefuse.frontends": "frontends", "tilefuse.lowering": "lowering",
            "tilefuse.runtime": "runtime", "tilefuse.models": "models"}
LAYERS = {"util": 0, "ir": 1, "planner": 2, "frontends": 2, "lowering": 3, "runtime": 4, "api": 5, "models": -1}
UTIL = {"tilefuse.config", "tilefuse.fileio", "tilefuse.progress", "tilefuse.disk_cache"}

MAX_LOCAL_IMPORTS = 12
MAX_LINES = 600


def layer(module: str) -> str:
    if module in UTIL:
        return "util"
    if module == "tilefuse.ir" or module.startswith("tilefuse.ops"):
        return "ir"
    for name in ("planner", "frontends", "lowering", "runtime", "models"):
        if module.startswith(f"tilefuse.{name}"):
            return name
    return "api"


@dataclass
class Imp:
    source: str
    target: str
    line: int
    local: bool  # inside a function
    names: tuple[str, ...] = ()


@dataclass
class Scan:
    files: dict[str, Path] = field(default_factory=dict)
    imports: list[Imp] = field(default_factory=list)

    def edges(self) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {m: set() for m in self.files}
        for i in self.imports:
            if i.target != i.source:
                out[i.source].add(i.target)
        return out

    def cycles(self) -> list[list[str]]:
        return [sorted(c) for c in _sccs(self.edges()) if len(c) > 1]

    def upward(self) -> list[Imp]:
        """Imports of a higher layer (frontends and planner may not import each other)."""
        out = []
        for i in self.imports:
            a, b = layer(i.source), layer(i.target)
            if a == "models" and b != "models" or b == "models" and a not in ("api", "models") or LAYERS[b] > LAYERS[a] or a != b and {a, b} == {"planner", "frontends"}:
                out.append(i)
        return out

    def local(self) -> list[Imp]:
        seen, out = set(), []
        for i in self.imports:
            if i.local and (i.source, i.line) not in seen:
                seen.add((i.source, i.line))
                out.append(i)
        return out

    def private(self) -> list[Imp]:
        return [i for i in self.imports if any(n.startswith("_") and not n.startswith("__") for n in i.names)]

    def lengths(self) -> dict[str, int]:
        return {m: len(p.read_text().splitlines()) for m, p in self.files.items()}


def scan() -> Scan:
    s = Scan()
    for pkg, folder in PACKAGES.items():
        base = ROOT / folder
        for path in sorted(base.rglob("*.py")):
            rel = path.relative_to(base).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            s.files[".".join([pkg, *parts])] = path
    for module, path in s.files.items():
        is_pkg = path.name == "__init__.py"
        tree = ast.parse(path.read_text(), str(path))
        _visit(s, module, is_pkg, tree, local=False)
    return s


def _visit(s: Scan, module: str, is_pkg: bool, node: ast.AST, local: bool) -> None:
    for child in ast.iter_child_nodes(node):
        inner = local or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        if isinstance(child, ast.Import):
            for a in child.names:
                target = _known(s, a.name)
                if target:
                    s.imports.append(Imp(module, target, child.lineno, local))
        elif isinstance(child, ast.ImportFrom):
            base = child.module or ""
            if child.level:
                pkg = module.split(".") if is_pkg else module.split(".")[:-1]
                pkg = pkg[: len(pkg) - child.level + 1]
                base = ".".join(pkg + ([base] if base else []))
            if not base.startswith("tilefuse"):
                continue
            for a in child.names:
                sub = f"{base}.{a.name}"
                if sub in s.files:
                    s.imports.append(Imp(module, sub, child.lineno, local))
                else:
                    target = _known(s, base)
                    if target:
                        s.imports.append(Imp(module, target, child.lineno, local, (a.name,)))
        _visit(s, module, is_pkg, child, inner)


def _known(s: Scan, name: str) -> str | None:
    while name and name not in s.files:
        name = name.rpartition(".")[0]
    return name or None


def _sccs(edges: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's strongly connected components (iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[set[str]] = []
    counter = 0
    for root in list(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = set()
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.add(w)
                    if w == v:
                        break
                out.append(comp)
    return out


def report(s: Scan) -> str:
    lines = [f"{len(s.files)} modules"]
    cyc = s.cycles()
    lines.append(f"import cycles: {len(cyc)}")
    lines += [f"  {len(c)}: {' '.join(c)}" for c in cyc]
    up = s.upward()
    lines.append(f"imports against the layers: {len(up)}")
    lines += [f"  {i.source}:{i.line} ({layer(i.source)}) -> {i.target} ({layer(i.target)})" for i in up]
    loc = s.local()
    lines.append(f"function-local imports of tilefuse modules: {len(loc)} (at most {MAX_LOCAL_IMPORTS})")
    lines += [f"  {i.source}:{i.line} -> {i.target}" for i in loc]
    long = {m: n for m, n in s.lengths().items() if n > MAX_LINES - 100}
    lines.append(f"modules over {MAX_LINES - 100} lines: {len(long)}")
    lines += [f"  {m}: {n}" for m, n in sorted(long.items(), key=lambda kv: -kv[1])]
    priv = s.private()
    lines.append(f"private names imported across modules: {len(priv)}")
    lines += [f"  {i.source}:{i.line} <- {i.target}.{','.join(i.names)}" for i in priv]
    return "\n".join(lines)


# ---- the checks ------------------------------------------------------------------------------------------------

def test_no_import_cycles():
    assert scan().cycles() == []


def test_imports_follow_the_layers():
    assert [f"{i.source}:{i.line} -> {i.target}" for i in scan().upward()] == []


def test_few_function_local_imports():
    loc = scan().local()
    assert len(loc) <= MAX_LOCAL_IMPORTS, "\n".join(f"{i.source}:{i.line} -> {i.target}" for i in loc)


def test_no_module_over_600_lines():
    assert {m: n for m, n in scan().lengths().items() if n > MAX_LINES} == {}


def test_no_private_names_cross_modules():
    assert [f"{i.source}:{i.line} <- {i.target}.{','.join(i.names)}" for i in scan().private()] == []


def test_scan_sees_function_local_imports_and_cycles():
    """The scan itself: a function-local import counts as an edge, and a two-module cycle is found."""
    s = Scan(files={"tilefuse.a": ROOT / "x", "tilefuse.b": ROOT / "y"})
    tree = ast.parse("def f():\n    from tilefuse import b\n")
    _visit(s, "tilefuse.a", False, tree, local=False)
    _visit(s, "tilefuse.b", False, ast.parse("from tilefuse.a import thing\n"), local=False)
    assert [(i.source, i.target, i.local) for i in s.imports] == [("tilefuse.a", "tilefuse.b", True),
                                                                   ("tilefuse.b", "tilefuse.a", False)]
    assert s.cycles() == [["tilefuse.a", "tilefuse.b"]]


if __name__ == "__main__":
    os.chdir(ROOT)
    print(report(scan()))
