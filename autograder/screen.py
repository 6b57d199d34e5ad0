"""Static screening of answer cells: an answer that reaches for the reference loses its exercise.

The verdicts are reached outside the student's kernel (``verdicts.py``), so nothing an answer does
to the kernel can change one: patching numpy, rebinding names, importing ``sys`` or ``os``, local
helpers are all fine and none is flagged. What an answer could still do in the kernel is compute
its values with the reference, which is installed there (the course's helpers need it). The
run-time guard in the checks catches calls into it however they are reached; this screen flags
what no answer needs and only a reach for the reference or around that guard does:

- importing from ``alibi_ref`` what the notebook's own locked cells do not hand out;
- assigning to an attribute of anything imported from ``alibi_ref`` (the checks, the guard);
- switching the profiler off (``sys.setprofile``, ``sys.settrace``: the guard is a profile hook);
- reading a function's or frame's insides (``__globals__``, ``__code__``, ``f_back``...), the
  way to the reference and the hidden cases' generators without an import.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

PACKAGE = "alibi_ref"
# the course's helpers a student may import anywhere: the example, the plots, the checks
HELPERS = {"alibi_ref.course.examples", "alibi_ref.course.plots", "alibi_ref.course.checks"}
GUARD_SWITCHES = {"setprofile", "settrace", "setprofile_all_threads", "settrace_all_threads"}
INSIDES = {"__globals__", "__code__", "__closure__", "__builtins__", "__subclasses__", "__dict__", "__self__",
           "__func__", "__wrapped__", "__defaults__", "__kwdefaults__", "f_back", "f_globals", "f_locals",
           "f_builtins", "f_code", "gi_frame", "gi_code", "cr_frame", "ag_frame", "tb_frame", "tb_next", "co_consts"}


@dataclass(frozen=True)
class Finding:
    cell: str  # the answer cell's grade_id
    line: int
    reason: str

    def __str__(self) -> str:
        return f"cell {self.cell!r}, line {self.line}: {self.reason}"


def _source(cell) -> str:
    # IPython magics and shell escapes are not Python: blank them out, keep the line numbers
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in cell.source.splitlines())


def _imports(tree: ast.AST) -> list[tuple[str, str, int]]:
    """Every (what is imported from alibi_ref, the name it is bound to, line)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, (a.asname or a.name).split(".")[0], node.lineno) for a in node.names
                      if a.name.split(".")[0] == PACKAGE]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == PACKAGE:
            found += [(_current_name(f"{node.module}.{a.name}"), a.asname or a.name, node.lineno) for a in node.names]
    return found


def _current_name(name: str) -> str:
    """The name the course has now for one it had before (``alibi_ref.multi_head_alibi``: see alibi_ref)."""
    from alibi_ref import _MOVED_TO_COURSE

    head, _, last = name.rpartition(".")
    return f"{PACKAGE}.course.{last}" if head == PACKAGE and last in _MOVED_TO_COURSE else name


def _reaches(tree: ast.AST, modules: set[str]) -> list[tuple[int, str]]:
    """(line, what) for every reach around the checks: see the module's docstring."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            for target in targets:
                root = target
                while isinstance(root, (ast.Attribute, ast.Subscript)):
                    root = root.value
                if target is not root and isinstance(root, ast.Name) and root.id in modules:
                    found.append((node.lineno, f"changes {root.id}, which comes from alibi_ref"))
        elif isinstance(node, ast.Attribute) and node.attr in GUARD_SWITCHES | INSIDES:
            what = "switches the profiler" if node.attr in GUARD_SWITCHES else "reads the insides of"
            found.append((node.lineno, f"{what} ({node.attr}), which no exercise needs"))
    return found


def _parse(cell):
    try:
        return ast.parse(_source(cell))
    except SyntaxError:
        return None  # a syntax error fails at run time, honestly, like any other mistake


def screen_notebook(nb) -> list[Finding]:
    """Findings for the notebook's answer cells (nbgrader solution cells of code)."""
    handed_out = set(HELPERS)
    modules = {PACKAGE}  # names bound by an import from alibi_ref anywhere in the notebook
    answers = []
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        tree = _parse(cell) if cell.cell_type == "code" else None
        if tree is None:
            continue
        imports = _imports(tree)
        modules |= {bound for _, bound, _ in imports}
        if meta.get("solution") and not meta.get("grade"):
            answers.append((meta.get("grade_id", "?"), tree, imports))
        elif meta.get("locked"):
            handed_out |= {name for name, _, _ in imports}
    findings = []
    for grade_id, tree, imports in answers:
        for name, _, line in imports:
            if not any(name == ok or name.startswith(ok + ".") for ok in handed_out):
                findings.append(Finding(grade_id, line, f"imports {name} from the reference module; this notebook "
                                                        "asks you to write it yourself"))
        findings += [Finding(grade_id, line, what) for line, what in _reaches(tree, modules)]
    return findings
