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


def _readme_table(heading: str, doc: str = "README.md") -> list[list[str]]:
    text = (ROOT / doc).read_text()
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


def test_design_layout_names_files_that_exist():
    rows = _readme_table("## Layout", "docs/design.md")
    named = set()
    for first, *_ in rows:
        for path in re.findall(r"`([^`]+)`", first):
            named.add(path)
            assert (ROOT / path).exists() or (PKG / path).exists(), path
    # every module of the package is in the table
    for p in PKG.rglob("*.py"):
        rel = p.relative_to(ROOT).as_posix()
        assert rel in named or p.name in named or (p.parent.relative_to(ROOT).as_posix() + "/") in named, rel


# ------------------------------------------------------------------------------------- documents name what exists

DOCUMENTS = (
    "README.md",
    "CHANGELOG.md",
    "benchmarks/README.md",
    *(f"docs/{p.name}" for p in sorted(ROOT.glob("docs/*.md"))),
)
# A path a document names: from the repository root, or from the package or benchmarks folder (`core/cost.py`,
# `diagnostics/profile_engine.py`, `csrc/row_select.cpp`), as the documents write them.
_ROOTS = {
    "benchmarks": "benchmarks", "tests": "tests", "vllm_lookahead": "vllm_lookahead", "examples": "examples",
    "docs": "docs", "core": "vllm_lookahead/core", "glue": "vllm_lookahead/glue",
    "backends": "vllm_lookahead/backends", "tools": "vllm_lookahead/tools", "devtools": "vllm_lookahead/devtools",
    "csrc": "vllm_lookahead/backends/cpu/csrc", "diagnostics": "benchmarks/diagnostics",
    "research": "benchmarks/research",
}  # fmt: skip
_PATH = re.compile(r"(?<![\w./<-])(" + "|".join(_ROOTS) + r")/([\w./*{},<>-]*)")
_LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")


def _repo_files() -> set[str]:
    """Files in the repository as a fresh clone has them: tracked ones, and new ones not ignored (not yet added)."""
    import subprocess

    try:
        out = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT, capture_output=True, check=True,
        ).stdout  # fmt: skip
    except (OSError, subprocess.CalledProcessError):  # not a checkout: what is on disk
        return {p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*") if p.is_file() and ".venv" not in p.parts}
    return {f for f in out.decode().split("\0") if f and (ROOT / f).exists()}


def _expand(path: str) -> list[str]:
    """`a_{x,y}.png` -> [`a_x.png`, `a_y.png`]."""
    m = re.search(r"\{([^{}]*)\}", path)
    if not m:
        return [path]
    return [q for alt in m.group(1).split(",") for q in _expand(path[: m.start()] + alt + path[m.end() :])]


def _names(path: str, files: set[str]) -> bool:
    import fnmatch

    path = path.rstrip("/")
    if any(c in path for c in "*?"):
        return any(fnmatch.fnmatch(f, path) for f in files)
    if path in files or any(f.startswith(path + "/") for f in files):
        return True
    module = re.fullmatch(r"(.+?)((?:\.[A-Za-z_]\w*)+)", path)  # `core/step_timer.StepTimer`: a module's attribute
    return module is not None and module.group(1) + ".py" in files


def _named_paths(doc: str) -> list[str]:
    """The repository paths a document names (placeholders such as `<dtype>` and output folders skipped)."""
    text = (ROOT / doc).read_text()
    found: list[str] = []
    for m in _PATH.finditer(text):
        root, rest = m.groups()
        rest = rest.rstrip(".,")
        if "<" in rest or not rest:
            continue
        path = f"{_ROOTS[root]}/{rest}"
        if path.startswith("benchmarks/results/") and path.endswith("/"):
            continue  # a folder the benchmarks write into, not a file of the repository
        found += _expand(path)
    for m in _LINK.finditer(text):
        target = m.group(1)
        if re.match(r"[a-z]+:", target):
            continue
        resolved = (ROOT / doc).parent.joinpath(target).resolve()
        if resolved.is_relative_to(ROOT):
            found.append(resolved.relative_to(ROOT).as_posix())
    return found


def test_documents_name_files_that_exist():
    files = _repo_files()
    missing = [f"{doc}: {path}" for doc in DOCUMENTS for path in _named_paths(doc) if not _names(path, files)]
    assert not missing, "documents name paths that are not in the repository:\n" + "\n".join(missing)


def test_document_paths_are_found():
    """The check above sees the paths the documents write, in each form."""
    text = "`benchmarks/bench_serve.py`, core/cost.py, `diagnostics/x.py --y`; see [r](results.md#gpu), (`docs/a.md`)."
    assert [f"{_ROOTS[r]}/{p.rstrip('.,')}" for r, p in _PATH.findall(text)] == [
        "benchmarks/bench_serve.py", "vllm_lookahead/core/cost.py", "benchmarks/diagnostics/x.py", "docs/a.md",
    ]  # fmt: skip
    assert _expand("a_{x,y}.png") == ["a_x.png", "a_y.png"]
    assert not _PATH.search("vllm/v1/worker/gpu/spec_decode/speculator.py and vllm_lookahead.core.params")


# What a reader is promised to find short: the page's line limit, and the result files a document may cite.
DOCUMENT_LINES = {"README.md": 300, "docs/results.md": 250, "CHANGELOG.md": 40}
RESULT_FILES = 40


def test_documents_stay_within_their_length():
    lines = {doc: len((ROOT / doc).read_text().splitlines()) for doc in DOCUMENT_LINES}
    long = {doc: n for doc, n in lines.items() if n > DOCUMENT_LINES[doc]}
    assert not long, f"documents over their line limit {DOCUMENT_LINES}: {long}"


def test_result_files_are_few():
    results = sorted(f for f in _repo_files() if f.startswith("benchmarks/results/"))
    assert len(results) <= RESULT_FILES, f"{len(results)} result files, at most {RESULT_FILES}"


def test_core_reads_no_environment():
    """The algorithm is configured by its parameters alone: no switch read from the environment under core/."""
    readers = [
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for path in (PKG / "core").rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if (isinstance(node, ast.Attribute) and node.attr in {"environ", "getenv", "environb"})
        or (isinstance(node, ast.Name) and node.id in {"environ", "getenv"})
    ]
    assert not readers, f"environment read in core/: {readers}"
