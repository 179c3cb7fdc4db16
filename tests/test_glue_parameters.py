"""The glue hands a step's state around in objects (`LookaheadStep`, `StepResult`) and their owners (`Drafting`,
`Verification`), not as loose arguments: no function in `vllm_lookahead/glue/` takes more than MAX_PARAMETERS named
parameters (`self` or `cls` not counted, nor `*args` / `**kwargs`, which pass vLLM's own arguments through)."""

from __future__ import annotations

import ast
from pathlib import Path

GLUE = Path(__file__).resolve().parents[1] / "vllm_lookahead" / "glue"
MAX_PARAMETERS = 6


def named_parameters(node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> list[str]:
    args = node.args
    names = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
    return names[1:] if names[:1] in (["self"], ["cls"]) else names


def too_many(source: str, where: str) -> list[str]:
    return [
        f"{where}:{node.lineno} {getattr(node, 'name', 'lambda')} takes {len(named_parameters(node))}"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
        and len(named_parameters(node)) > MAX_PARAMETERS
    ]


def test_no_glue_function_takes_more_than_six_parameters():
    modules = sorted(GLUE.rglob("*.py"))
    assert len(modules) > 20  # the whole glue, patches included
    found = [hit for path in modules for hit in too_many(path.read_text(), path.relative_to(GLUE).as_posix())]
    assert not found, "\n".join(found)


def test_the_count_leaves_out_self_and_pass_through_arguments_only():
    source = """
class A:
    def method(self, a, b, c, d, e, f, *args, **kwargs): ...
    @classmethod
    def make(cls, a, b, c, d, e, f): ...
def seven(a, b, c, d, e, f, g): ...
def keywords(a, b, c, d, e, f, *, g): ...
def positional(a, /, b, c, d, e, f, g): ...
late = lambda a, b, c, d, e, f, g: a
"""
    found = too_many(source, "x.py")
    assert [hit.split()[1] for hit in found] == ["seven", "keywords", "positional", "lambda"], found
    assert all(hit.endswith("takes 7") for hit in found)
