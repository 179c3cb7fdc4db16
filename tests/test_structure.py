"""The code's shape: the package is laid out by layer and imports flow one way, and the README says what the code
does (its key table is LookaheadParams, its layout table names files that exist).

Layers, lowest first: `core` (the algorithm: no vLLM, nothing above it), `backends` (attention backends: no glue),
`glue` (the vLLM glue and its patches), `plugin` (the entry point). `tools` (users' set-up commands) and `devtools`
(development tooling, not shipped) sit apart: nothing the plugin imports at run time imports them.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

from vllm_lookahead.core.params import LookaheadParams

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "vllm_lookahead"
# Top-level modules every layer may use (no vLLM, no package imports of their own but these).
SHARED = {"vllm_lookahead", "vllm_lookahead.cache"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PKG.rglob("*.py")}


def _imports(path: Path, modules: dict[str, Path]) -> tuple[set[str], set[str]]:
    """(package modules imported anywhere in the file, top-level names of outside packages imported)."""
    inside: set[str] = set()
    outside: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{a.name}" for a in node.names] + [node.module]
        for name in names:
            if name.split(".")[0] != "vllm_lookahead":
                outside.add(name.split(".")[0])
                continue
            # the longest prefix that is one of our modules
            parts = name.split(".")
            for k in range(len(parts), 0, -1):
                cand = ".".join(parts[:k])
                if cand in modules:
                    inside.add(cand)
                    break
    return inside, outside


def _graph() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    modules = _modules()
    edges: dict[str, set[str]] = {}
    outside: dict[str, set[str]] = {}
    for name, path in modules.items():
        inside, out = _imports(path, modules)
        edges[name] = inside - {name}
        outside[name] = out
    return edges, outside


def _short(name: str) -> str:
    return name.removeprefix("vllm_lookahead.")


def test_import_graph_is_acyclic():
    edges, _ = _graph()
    state: dict[str, int] = {}
    cycle: list[str] = []

    def visit(u: str, stack: list[str]) -> bool:
        state[u] = 1
        for v in sorted(edges[u]):
            if state.get(v) == 1:
                cycle.extend([*stack[stack.index(v) :], v] if v in stack else [u, v])
                return True
            if v not in state and visit(v, [*stack, v]):
                return True
        state[u] = 2
        return False

    for u in sorted(edges):
        if u not in state and visit(u, [u]):
            break
    assert not cycle, " -> ".join(cycle)


def _layer(name: str) -> str:
    parts = name.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and (PKG / parts[1]).is_dir()) else name


def test_layers_import_downwards_only():
    edges, outside = _graph()
    allowed = {
        "core": {"core"},
        "backends": {"core", "backends"},
        "glue": {"core", "backends", "glue"},
        "vllm_lookahead.plugin": {"glue"},
        "tools": {"core", "backends", "glue", "tools", "vllm_lookahead.plugin"},
        "devtools": {"core", "backends", "glue", "tools", "devtools", "vllm_lookahead.plugin"},
    }
    layers = {_layer(n) for n in edges} - SHARED
    assert {"core", "backends", "glue", "tools", "devtools", "vllm_lookahead.plugin"} <= layers, layers
    for name, deps in edges.items():
        me = _layer(name)
        if name in SHARED:
            assert deps <= SHARED, f"{name} imports {deps - SHARED}"
            continue
        used = {_layer(d) for d in deps if d not in SHARED}
        assert me in allowed, f"{name}: a module outside the layers"
        assert used <= allowed[me], f"{name} ({me}) imports {used - allowed[me]}"
        if me == "core":
            assert "vllm" not in outside[name], f"{name} imports vllm: the core is the algorithm alone"


def test_run_time_code_imports_no_tools():
    edges, _ = _graph()
    apart = {"tools", "devtools"}
    for name, deps in edges.items():
        if _layer(name) not in apart:
            assert not {d for d in deps if _layer(d) in apart}, f"{name} imports the set-up tooling"


def test_backends_import_no_vllm_at_module_level_but_their_own():
    """The backend interface and the chain backend load anywhere (no vLLM, no Triton): selection imports them first."""
    for mod in ("base.py", "chain.py", "__init__.py"):
        tree = ast.parse((PKG / "backends" / mod).read_text())
        top = [n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)]
        names = {a.name.split(".")[0] for n in top if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module.split(".")[0] for n in top if isinstance(n, ast.ImportFrom) and n.module}
        assert not names & {"vllm", "triton"}, (mod, names)


def test_no_top_level_patches_package_is_shipped():
    import tomllib

    find = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    assert find["include"] == ["vllm_lookahead*"]
    assert find["exclude"] == ["vllm_lookahead.devtools*"]  # development tooling is not shipped
    assert not (ROOT / "patches").exists()


def _readme_table(heading: str) -> list[list[str]]:
    text = (ROOT / "README.md").read_text()
    section = text[text.index(heading) :]
    rows = []
    for line in section.splitlines()[1:]:
        if line.startswith("#"):
            break
        if line.startswith("|") and not line.startswith("|---"):
            rows.append([c.strip() for c in line.strip("|").split("|")])
    return rows[1:]  # without the header row


def test_readme_key_table_is_lookahead_params():
    rows = _readme_table("### Keys of `speculative_config`")
    table = {re.sub(r"`|\s*\(.*\)", "", r[0]): r for r in rows}
    assert "method" not in table
    assert list(table)[: len(LookaheadParams.keys())] == list(LookaheadParams.keys())
    for f in dataclasses.fields(LookaheadParams):
        _, default, rng = table[f.name][:3]
        assert default == ("null" if f.default is None else str(f.default).lower()), f.name
        lo_hi = f.metadata["range"]
        assert rng == ("bool" if lo_hi is None else lo_hi if lo_hi == "path" else f"{lo_hi[0]}..{lo_hi[1]}"), f.name


def test_readme_layout_names_files_that_exist():
    rows = _readme_table("## Layout")
    named = set()
    for first, *_ in rows:
        for path in re.findall(r"`([^`]+)`", first):
            named.add(path)
            assert (ROOT / path).exists() or (PKG / path).exists(), path
    # every module of the package is in the table
    for p in PKG.rglob("*.py"):
        rel = p.relative_to(ROOT).as_posix()
        assert rel in named or p.name in named or (p.parent.relative_to(ROOT).as_posix() + "/") in named, rel
