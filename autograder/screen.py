"""The one static rule on what a student writes: an answer that imports the reference loses its exercise.

A graded kernel cannot reach the reference (its view of the package holds none: alibi_ref/course/view.py),
so no rule is needed to stop an answer from using it there; an answer that imports it fails with
an ImportError. In the student's own session the reference is installed, though, and such an answer
passes its visible checks: this screen says so before the student submits (nbgrader's Validate, through
the students' nbgrader_config.py: ``autograder.validate``), and grading fails its exercise with the
same message (``execute.py``). What is handed out is what the notebook's locked cells import
(``HELPERS`` besides); a cell of the student's own may import anything (comparing with the reference is
study), and a Python module handed in beside the notebook is held to the rule from the notebook's top
(``imported_modules``: its code runs wherever an answer imports it).

Everything else an answer does in its kernel (patching numpy or the checks, threads, processes,
``exec``, looking inside objects) is its own business: nothing judged lives there.
"""

from __future__ import annotations

import ast
import itertools
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

PACKAGE = "alibi_ref"
# where the grader puts the Python modules a student handed in beside the notebooks: a folder in the kernel's
# own, put last on its sys.path (autograder/sandbox.py), so that no installed module is shadowed by one
MODULES = "student_modules"
# the course's helpers a student may import anywhere: the example, the plots, the checks
HELPERS = {"alibi_ref.course.examples", "alibi_ref.course.plots", "alibi_ref.course.checks"}


@dataclass(frozen=True)
class Finding:
    cell: str  # the answer cell's grade_id, or "a module you handed in (NAME.py)"
    line: int
    reason: str
    index: int = -1  # the cell's position in the notebook; -1: before the first (a module handed in)
    lasting: bool = False  # fails every exercise after it, not only its own (a module: it runs wherever imported)

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
            found += [(f"{node.module}.{a.name}", a.asname or a.name, node.lineno) for a in node.names]
    return found


def _parse(cell):
    try:
        return ast.parse(_source(cell))
    except SyntaxError:
        return None  # a syntax error fails at run time, honestly, like any other mistake


def is_module_name(name: str) -> bool:
    """A name ``import name`` can reach as a module (``NAME.py``; ``__init__`` and the like are none)."""
    return bool(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name)) and not name.startswith("__")


def is_script_name(name: str) -> bool:
    """A module's name, or one only ``%run`` reaches (``%run hw1-helpers.py``: no import can)."""
    return bool(re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_-]*", name)) and not name.startswith("__")


def module_sources(folder: Path) -> dict[str, str]:
    """{name: source} of the modules in ``folder``, the scripts only %run reaches, and the files of the packages
    there, named by their path (``mylib/core``: ``package_of``); one that is not text is skipped: it cannot run."""
    found = {}
    for path in sorted(folder.rglob("*.py")) if folder.is_dir() else ():
        parts = path.relative_to(folder).with_suffix("").parts
        if (is_script_name(parts[0]) if len(parts) == 1 else
                all(map(is_module_name, parts[:-1])) and (is_module_name(parts[-1]) or parts[-1] == "__init__")):
            try:
                found["/".join(parts)] = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                continue
    return found


def package_of(name: str) -> str:
    """What ``import`` names a student's module by: ``helpers`` for helpers.py, ``mylib`` for mylib/core.py."""
    return name.split("/")[0]


def _imported_names(tree: ast.AST) -> set[str]:
    """The top-level names of the absolute imports in ``tree``."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def imported_names(nb) -> set[str]:
    """The top-level names of the absolute imports in the notebook's code cells (``numpy`` for
    ``from numpy.linalg import norm``)."""
    trees = (_parse(cell) for cell in nb.cells if cell.cell_type == "code")
    return set().union(*(_imported_names(tree) for tree in trees if tree is not None))


def run_scripts(nb) -> tuple[set[str], set[str]]:
    """What the notebook's ``%run`` lines run: (scripts by file name, ``%run helpers.py`` or ``%run -i
    helpers``, as module names; modules by name, ``%run -m helpers``). A script is looked for in the
    kernel's working folder, so grading puts those of the student's there (``execute``); only scripts
    in the notebook's own folder count, as only those are handed in."""
    scripts, modules = set(), set()
    for cell in nb.cells:
        for line in cell.source.splitlines() if cell.cell_type == "code" else ():
            words = line.split()
            if not words or words[0] != "%run":
                continue
            try:
                words = shlex.split(line.strip()[len("%run"):])
            except ValueError:
                continue  # unbalanced quotes: IPython refuses the line as well
            options = list(itertools.takewhile(lambda word: word.startswith("-"), words))
            if len(words) == len(options):
                continue
            target = words[len(options)]  # what follows is the script's own argv
            if "-m" in options:
                modules.add(target)
            elif str(Path(target).parent) == "." and Path(target).suffix in (".py", ""):
                scripts.add(Path(target).stem)  # IPython adds .py to a name it does not find as it is
    return scripts, modules


def imported_modules(nb, sources: dict[str, str]) -> dict[str, str]:
    """Those of the student's ``sources`` that the notebook's code cells import or ``%run``, and those they
    import in turn: the modules grading hands the notebook. A package goes whole (its files reach each other
    by relative imports). One nothing imports is left out: no code of the student's then runs unscreened, as a
    module some installed package looks for by name would."""
    scripts, by_name = run_scripts(nb)
    wanted = scripts | {name.split(".")[0] for name in by_name}
    wanted |= imported_names(nb)
    found, todo = {}, sorted(wanted)
    while todo:
        package = todo.pop()
        for name in sorted(n for n in sources if package_of(n) == package and n not in found):
            found[name] = sources[name]
            try:
                todo += sorted(_imported_names(ast.parse(sources[name])))
            except SyntaxError:
                pass  # fails when imported, as it would in the student's Jupyter
    return found


def screen_notebook(nb, student_modules: dict[str, str] | None = None) -> list[Finding]:
    """Findings for the answer cells (nbgrader solution cells) and the Python modules handed in beside the notebook
    (``student_modules``, {name: source}, ``imported_modules``): each import from alibi_ref that the notebook's
    locked cells do not hand out. A module's finding fails every exercise (``Finding.lasting``): its code runs
    wherever an answer imports it."""
    handed_out = set(HELPERS)
    written = []
    for name, source in (student_modules or {}).items():
        try:
            written.append((-1, f"a module you handed in ({name}.py)", True, _imports(ast.parse(source))))
        except SyntaxError:
            continue
    for index, cell in enumerate(nb.cells):
        meta = cell.metadata.get("nbgrader", {})
        tree = _parse(cell) if cell.cell_type == "code" else None
        if tree is None:
            continue
        if meta.get("solution") and not meta.get("grade"):
            written.append((index, meta.get("grade_id", "?"), False, _imports(tree)))
        elif meta.get("locked") or meta.get("grade"):
            handed_out |= {name for name, _, _ in _imports(tree)}
    return [Finding(label, line, f"imports {name} from the reference module; this notebook asks you to write it "
                                 "yourself (a graded kernel does not have it)", index, lasting)
            for index, label, lasting, imports in written for name, _, line in imports
            if not any(name == ok or name.startswith(ok + ".") for ok in handed_out)]


def flagged_test_cells(nb, findings: list[Finding]) -> dict[int, str]:
    """{test cell's index: why it fails}: the first test cell after each flagged cell (its exercise's); after a
    lasting finding, every test cell below it."""
    failing, pending, lasting = {}, [], [f for f in findings if f.index < 0 and f.lasting]
    for index, cell in enumerate(nb.cells):
        if not cell.metadata.get("nbgrader", {}).get("grade"):
            here = [f for f in findings if f.index == index]
            pending += [f for f in here if not f.lasting]
            lasting += [f for f in here if f.lasting]
        elif cell.cell_type == "code" and (pending or lasting):
            failing[index] = "no points for this exercise: " + "; ".join(str(f) for f in lasting + pending)
            pending = []
    return failing


def fail_flagged_exercises(nb, findings: list[Finding]) -> None:
    """Each flagged test cell (``flagged_test_cells``) fails, with the reason, in an executed notebook."""
    for index, why in flagged_test_cells(nb, findings).items():
        _fail(nb.cells[index], why)


def _fail(cell, why: str) -> None:
    from .verdicts import error_output

    cell.outputs.append(error_output("Flagged", why))
