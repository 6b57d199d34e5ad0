"""Static screening of answer cells: code that reaches into the grader's machinery is flagged.

Test cells run in the same interpreter as the student's code, so an answer could patch the
comparison functions (``np.testing.assert_allclose = ...``), rebind a helper the tests use
(``def assert_close(*a, **k): pass``), switch off the guard against calling the reference
(``sys.setprofile``), or call the reference itself. None of that is needed to answer any
exercise, so the answer cells are read with ``ast`` before anything runs and such code is
flagged: the notebook then earns no autograded points from that cell on, with the reason.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

# modules an answer never needs and that give access to the interpreter or the machine
FORBIDDEN_MODULES = {"sys", "os", "importlib", "gc", "ctypes", "inspect", "builtins", "subprocess", "socket",
                     "multiprocessing", "threading", "signal", "marshal", "types", "shutil", "pathlib", "io",
                     "unittest", "pickle", "code", "runpy", "alibi_ref", "atexit", "resource", "tracemalloc"}
FORBIDDEN_CALLS = {"exec", "eval", "compile", "__import__", "setattr", "delattr", "globals", "vars", "locals",
                   "open", "breakpoint", "input"}
ALLOWED_DUNDERS = {"__init__", "__name__", "__doc__", "__len__", "__call__", "__repr__", "__str__"}
# IPython keeps every executed cell's source, hidden tests included, in these names
IPYTHON_HISTORY = {"In", "Out", "_ih", "_oh", "_dh", "_i", "_ii", "_iii", "get_ipython"}
# frames, tracebacks and code objects lead to the callers' globals and sources
INTROSPECTION_ATTRS = {"f_back", "f_globals", "f_locals", "f_builtins", "f_code", "gi_frame", "gi_code", "cr_frame",
                       "ag_frame", "tb_frame", "tb_next", "co_code", "co_consts"}


@dataclass(frozen=True)
class Finding:
    cell: str  # the answer cell's grade_id
    line: int
    reason: str

    def __str__(self) -> str:
        return f"cell {self.cell!r}, line {self.line}: {self.reason}"


def _root_name(node: ast.AST) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _source(cell) -> str:
    # IPython magics and shell escapes are not Python; an answer has no use for them
    lines = []
    for line in cell.source.splitlines():
        stripped = line.lstrip()
        lines.append(f"__magic__({stripped[:1]!r})" if stripped.startswith(("%", "!")) else line)
    return "\n".join(lines)


class _TopLevel(ast.NodeVisitor):
    """Names bound at the cell's top level (module scope), with the node that binds them."""

    def __init__(self):
        self.bindings: list[tuple[str, ast.AST]] = []

    def visit_FunctionDef(self, node):  # the body is a new scope; only the name is bound here
        self.bindings.append((node.name, node))

    visit_AsyncFunctionDef = visit_ClassDef = visit_FunctionDef

    def visit_Lambda(self, node):
        pass

    def visit_ListComp(self, node):
        pass

    visit_SetComp = visit_DictComp = visit_GeneratorExp = visit_ListComp

    def visit_Name(self, node):
        if isinstance(node.ctx, (ast.Store, ast.Del)):
            self.bindings.append((node.id, node))

    def visit_alias(self, node):
        self.bindings.append(((node.asname or node.name).split(".")[0], node))


def _top_level(tree: ast.AST) -> list[tuple[str, ast.AST]]:
    visitor = _TopLevel()
    visitor.visit(tree)
    return visitor.bindings


def _loaded_names(tree: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def screen_notebook(nb) -> list[Finding]:
    """Findings for the notebook's answer cells (nbgrader solution cells of code)."""
    locked_bound, test_reads, locked_imports = set(), set(), {}
    module_names = set(FORBIDDEN_MODULES) | {"np", "numpy", "torch", "F", "nn", "plt"}
    answers = []
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if cell.cell_type != "code":
            continue
        try:
            tree = ast.parse(_source(cell))
        except SyntaxError:
            continue  # a syntax error fails at run time, honestly, like any other mistake
        module_names |= {(a.asname or a.name).split(".")[0] for a in ast.walk(tree) if isinstance(a, ast.alias)}
        if meta.get("solution") and not meta.get("grade"):
            answers.append((meta.get("grade_id", "?"), tree))
            continue
        if meta.get("locked") or meta.get("grade"):
            locked_bound |= {name for name, _ in _top_level(tree)}
            locked_imports |= {a.asname or a.name: a.name for a in ast.walk(tree) if isinstance(a, ast.alias)}
        if meta.get("grade"):
            test_reads |= _loaded_names(tree)
    # what the tests read but the notebook, not the student, provides: the helpers and the inputs
    protected = locked_bound & test_reads
    findings = []
    for grade_id, tree in answers:
        findings += _screen_answer(grade_id, tree, protected, module_names, locked_imports)
    return findings


def _screen_answer(grade_id: str, tree: ast.AST, protected: set, module_names: set,
                   locked_imports: dict) -> list[Finding]:
    found = []

    def flag(node, reason):
        found.append(Finding(grade_id, getattr(node, "lineno", 0), reason))

    for name, node in _top_level(tree):
        # `import numpy as np` again binds the very same module: harmless
        same_import = isinstance(node, ast.alias) and locked_imports.get(node.asname or node.name) == node.name
        if name in protected and not same_import:
            flag(node, f"rebinds {name}, which the notebook provides and its tests use")
    for node in ast.walk(tree):
        if isinstance(node, (ast.Global, ast.Nonlocal)):
            flag(node, f"declares {', '.join(node.names)} global")
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            for module in modules:
                if module.split(".")[0] in FORBIDDEN_MODULES:
                    flag(node, f"imports {module}, which no answer needs")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in FORBIDDEN_CALLS:
            flag(node, f"calls {node.func.id}()")
        elif isinstance(node, ast.Attribute) and node.attr.startswith("__") and node.attr not in ALLOWED_DUNDERS:
            flag(node, f"uses the special attribute {node.attr}")
        elif isinstance(node, ast.Attribute) and node.attr in INTROSPECTION_ATTRS:
            flag(node, f"inspects the interpreter ({node.attr})")
        elif isinstance(node, ast.Name) and (node.id in IPYTHON_HISTORY or re.fullmatch(r"_i\d+", node.id)):
            flag(node, f"reads IPython's history ({node.id})")
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            roots = {_root_name(t) for target in targets for t in ast.walk(target)
                     if isinstance(t, (ast.Attribute, ast.Subscript))}
            for root in sorted(roots & module_names):
                flag(node, f"changes an attribute of the module {root}")
    return found
