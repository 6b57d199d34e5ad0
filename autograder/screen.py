"""Static screening of the cells a student writes: an answer that reaches for the reference loses its exercise.

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
  way to the reference and the hidden cases' generators without an import;
- the other ways around the import rule and the guard, none of which an exercise needs: reaching
  a module without an import statement (``sys.modules``, ``importlib``, ``__import__``), running
  code in another thread or process (``threading``, ``concurrent.futures``, ``subprocess``,
  ``os.system``...: the guard watches only the threads started while it runs), walking the
  interpreter's objects or frames (``gc``, ``ctypes``, ``inspect.stack``, ``sys._getframe``),
  running code built at run time (``exec``, ``eval``, ``compile``), setting attributes through
  ``setattr`` or changing private attributes and keys (outside a class's own ``self``, and of objects
  other than those the notebook makes itself: a dict it writes out, an instance of its own class), and
  private names of the course's helpers (``checks._lend``).

Answer cells are held to all of it; cells the student added, to what lasts (``Finding.lasting``), and
so are the Python modules handed in beside a notebook that its cells import or ``%run``
(``imported_modules``): a lasting finding in one fails every test cell of the notebook.
A finding fails its exercise's test cell; one that lasts, every test cell after it
(``flagged_test_cells``). The autograder applies it after running a notebook (``execute.py``),
and Validate, through the students' nbgrader_config.py, the same way (``autograder.validate``).
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
GUARD_SWITCHES = {"setprofile", "settrace", "setprofile_all_threads", "settrace_all_threads"}
INSIDES = {"__globals__", "__code__", "__closure__", "__builtins__", "__subclasses__", "__dict__", "__self__",
           "__func__", "__wrapped__", "__defaults__", "__kwdefaults__", "f_back", "f_globals", "f_locals",
           "f_builtins", "f_code", "gi_frame", "gi_code", "cr_frame", "ag_frame", "tb_frame", "tb_next", "co_consts",
           "__setattr__", "__delattr__", "__import__", "__loader__", "__spec__"}
# modules whose every use goes around the import rule or the guard, and what each use does
AROUND = {
    **dict.fromkeys(["importlib", "runpy", "pkgutil", "imp", "zipimport", "builtins"],
                    "reaches modules without an import statement"),
    **dict.fromkeys(["threading", "_thread", "concurrent", "multiprocessing", "subprocess", "_posixsubprocess",
                     "asyncio", "pty"],
                    "runs code in another thread or process"),
    **dict.fromkeys(["gc", "ctypes"], "walks the interpreter's objects"),
}
# single functions of modules an answer may otherwise use
AROUND_NAMES = {
    "sys.modules": "reaches modules without an import statement",
    **dict.fromkeys(["sys._getframe", "sys._current_frames", "inspect.currentframe", "inspect.stack", "inspect.trace",
                     "inspect.getouterframes", "inspect.getinnerframes", "inspect.getmembers", "inspect.getmodule",
                     "inspect.getclosurevars"], "walks the interpreter's frames or objects"),
    **dict.fromkeys([f"os.{name}" for name in ("system", "popen", "fork", "forkpty", "posix_spawn", "posix_spawnp",
                                                "spawnl", "spawnle", "spawnlp", "spawnlpe", "spawnv", "spawnve",
                                                "spawnvp", "spawnvpe", "execl", "execle", "execlp", "execlpe", "execv",
                                                "execve", "execvp", "execvpe")],
                    "runs code in another process"),
}
BUILTINS = {
    **dict.fromkeys(["exec", "eval", "compile"], "runs code built at run time, which the screen cannot read"),
    "__import__": "reaches modules without an import statement",
    "__builtins__": "reaches modules without an import statement",
    "vars": "reads the insides of an object (vars)",
}


@dataclass(frozen=True)
class Finding:
    cell: str  # the answer cell's grade_id, or "a cell you added (cell N)"
    line: int
    reason: str
    index: int = -1  # the cell's position in the notebook; -1: before the first (a module handed in)
    # fails every exercise after the cell, not only its own: what it does (a guard switched off, a module
    # patched through sys.modules, a thread left running) lasts for the rest of the notebook
    lasting: bool = False

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


def _reaches(tree: ast.AST, modules: set[str], bound: dict[str, str],
             owned: frozenset[str]) -> list[tuple[int, str, bool]]:
    """(line, what, lasting) for every reach around the checks: see the module's docstring and ``Finding``.
    ``owned``: names of objects the notebook makes itself (``_owned``), whose private parts are its own."""
    mine = owned | {"self", "cls"}
    # functions and classes the notebook defines, by names it binds no other way
    defined = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))} - {
        n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)} - modules
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            for target in targets:
                root = target
                while isinstance(root, (ast.Attribute, ast.Subscript)):
                    root = root.value
                if target is not root and isinstance(root, ast.Name) and root.id in modules:
                    found.append((node.lineno, f"changes {root.id}, which comes from alibi_ref", True))
                elif _private(target) and not (isinstance(root, ast.Name) and root.id in mine):
                    found.append((node.lineno, f"changes a private part of an object ({_private(target)}), "
                                               "which no exercise needs", True))
        elif (isinstance(node, ast.Attribute) and node.attr == "__dict__" and isinstance(node.value, ast.Name)
              and node.value.id in defined):
            continue  # a function or class of the notebook's own keeps what it likes in its __dict__ (a memo)
        elif isinstance(node, ast.Attribute) and node.attr in GUARD_SWITCHES | INSIDES:
            what = "switches the profiler" if node.attr in GUARD_SWITCHES else "reads the insides of"
            found.append((node.lineno, f"{what} ({node.attr}), which no exercise needs", node.attr in GUARD_SWITCHES))
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and _root(node) in modules:
            found.append((node.lineno, f"uses {node.attr}, a private part of the course's machinery", True))
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [f"{node.module}.{a.name}" for a in node.names] if node.level == 0 and node.module else [])
            found += [(node.lineno, what, True) for what in map(_around, names) if what]
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == PACKAGE:
                found += [(node.lineno, f"imports {a.name}, a private part of the course's machinery", True)
                          for a in node.names if a.name.startswith("_")]
        elif isinstance(node, (ast.Attribute, ast.Name)) and isinstance(node.ctx, ast.Load):
            what = _around(_dotted(node, bound))
            if what:
                found.append((node.lineno, what, True))
        if isinstance(node, ast.Name) and node.id == "__builtins__":
            found.append((node.lineno, f"{BUILTINS[node.id]} (__builtins__), which no exercise needs", True))
        elif isinstance(node, ast.Call):
            found += [(node.lineno, *found_here) for found_here in [_builtin_call(node, modules, mine)] if found_here]
    return sorted(set(found))


# attributes Python documents for anyone to set on a function (inspect reads __signature__: notebook 10 teaches
# giving a closure dot_product_attention's signature); neither reaches past the checks
PUBLIC_DUNDERS = {"__signature__", "__doc__"}


def _private(target: ast.AST) -> str | None:
    """The name of the private attribute or key an assignment target changes (``G._hook``, ``g["_x"]``)."""
    if isinstance(target, ast.Attribute) and target.attr.startswith("_") and target.attr not in PUBLIC_DUNDERS:
        return target.attr
    key = target.slice if isinstance(target, ast.Subscript) else None
    if isinstance(key, ast.Constant) and isinstance(key.value, str) and key.value.startswith("_"):
        return key.value
    return None


def _root(node: ast.AST) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _owned(trees: list[ast.AST], modules: set[str]) -> frozenset[str]:
    """Names the notebook binds only to objects it makes itself, and never otherwise: a dict, list or set it
    writes out or builds (``{}``, a comprehension, ``dict(...)``), or an instance of a class it defines on
    bases not from alibi_ref. Their private keys and attributes (``cache["_last"]``, ``m._slopes``) are the
    student's own state: the rule against changing private parts is for objects that came from elsewhere
    (a guard, a module's globals)."""
    trees = list(trees)
    classes = {node.name for tree in trees for node in ast.walk(tree)
               if isinstance(node, ast.ClassDef) and not any(_root(base) in modules for base in node.bases)}
    made, other, direct = set(), set(), set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    if isinstance(target, ast.Name):
                        direct.add(id(target))
                        (made if _makes_its_own(node.value, classes) else other).add(target.id)
    for tree in trees:  # every other way a name is bound: a loop, with ... as, a parameter, an import, :=
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)) and id(node) not in direct:
                other.add(node.id)
            elif isinstance(node, ast.arg):
                other.add(node.arg)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                other |= {a.asname or a.name.split(".")[0] for a in node.names}
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Global, ast.Nonlocal)):
                other |= set(getattr(node, "names", [getattr(node, "name", "")]))
    return frozenset(made - other)


def _makes_its_own(value: ast.AST, classes: set[str]) -> bool:
    if isinstance(value, (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)):
        return True
    return isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in (
        classes | {"dict", "list", "set"})


def _bound_modules(trees) -> dict[str, str]:
    """name -> the dotted name an import anywhere in the notebook binds it to (``import numpy as np``: np -> numpy)."""
    bound = {}
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                bound |= {a.asname or a.name.split(".")[0]: a.name if a.asname else a.name.split(".")[0]
                          for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                bound |= {a.asname or a.name: f"{node.module}.{a.name}" for a in node.names}
    return bound


def _dotted(node: ast.AST, bound: dict[str, str]) -> str | None:
    """``torch.multiprocessing.Process`` for an expression rooted in an imported name, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name) or node.id not in bound:
        return None
    return ".".join([bound[node.id], *reversed(parts)])


def _around(dotted: str | None) -> str | None:
    """What reaching ``dotted`` (a module or something in one) does around the checks, or None."""
    if not dotted:
        return None
    parts = dotted.split(".")
    for i, part in enumerate(parts):
        if part in AROUND:
            return f"{AROUND[part]} ({'.'.join(parts[:i + 1])}), which no exercise needs"
        for name, what in AROUND_NAMES.items():
            if parts[i:i + 2] == name.split("."):
                return f"{what} ({name}), which no exercise needs"
    return None


def _builtin_call(call: ast.Call, modules: set[str], mine: frozenset[str]) -> tuple[str, bool] | None:
    """(what, lasting) for a call of a builtin that goes around the checks (exec, setattr outside self, ...).
    ``modules``: the names bound to something from alibi_ref; ``mine``: to objects the notebook made."""
    if not isinstance(call.func, ast.Name):
        return None
    name, args = call.func.id, call.args
    if name == "vars" and args:
        return f"{BUILTINS[name]}, which no exercise needs", False
    if name in BUILTINS and name != "vars":
        return f"{BUILTINS[name]} ({name}), which no exercise needs", True
    if name in ("setattr", "delattr") and not (args and isinstance(args[0], ast.Name) and args[0].id in mine):
        return f"sets an attribute through {name} (outside a class's own self), which no exercise needs", True
    if name in ("getattr", "hasattr") and len(args) > 1 and isinstance(args[1], ast.Constant):
        attribute = str(args[1].value)
        if attribute in GUARD_SWITCHES:
            return f"switches the profiler ({attribute}), which no exercise needs", True
        if attribute in INSIDES or _around(f"sys.{attribute}"):
            return f"reads the insides of an object ({attribute}), which no exercise needs", False
    if name in ("getattr", "hasattr") and len(args) > 1 and not isinstance(args[1], ast.Constant) and (
            _root(args[0]) in modules):
        return (f"reads an attribute of {_root(args[0])}, which comes from alibi_ref, by a name computed at run "
                "time (getattr), which no exercise needs", False)
    return None


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
    for cell in nb.cells:
        tree = _parse(cell) if cell.cell_type == "code" else None
        wanted |= _imported_names(tree) if tree is not None else set()
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
    """Findings for the code cells a student writes: the answer cells (nbgrader solution cells) and any
    cell of their own (no nbgrader metadata: added, or pasted in). A cell of the student's own is held
    only to what lasts (``Finding.lasting``): there, importing the reference to compare an answer with it,
    or looking inside an object, is study, and the guard still fails any answer that calls the reference.
    ``student_modules`` ({name: source}, ``imported_modules``) are held to what lasts too, from the top of
    the notebook: a module's code runs wherever it is first imported."""
    handed_out = set(HELPERS)
    modules = {PACKAGE}  # names bound by an import from alibi_ref anywhere in the notebook
    trees, written = [], []
    for name, source in (student_modules or {}).items():
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        trees.append(tree)
        imports = _imports(tree)
        modules |= {bound for _, bound, _ in imports}
        written.append((-1, f"a module you handed in ({name}.py)", True, tree, imports))
    for index, cell in enumerate(nb.cells):
        meta = cell.metadata.get("nbgrader", {})
        tree = _parse(cell) if cell.cell_type == "code" else None
        if tree is None:
            continue
        trees.append(tree)
        imports = _imports(tree)
        modules |= {bound for _, bound, _ in imports}
        if meta.get("solution") and not meta.get("grade"):
            written.append((index, meta.get("grade_id", "?"), False, tree, imports))
        elif not (meta.get("locked") or meta.get("grade") or meta.get("solution")):
            written.append((index, f"a cell you added (cell {index + 1})", True, tree, imports))
        else:
            handed_out |= {name for name, _, _ in imports}
    bound = _bound_modules(trees)
    owned = _owned(trees, modules)
    findings = []
    for index, label, own, tree, imports in written:
        for name, _, line in imports if not own else ():
            if not any(name == ok or name.startswith(ok + ".") for ok in handed_out):
                findings.append(Finding(label, line, f"imports {name} from the reference module; this notebook "
                                                     "asks you to write it yourself", index))
        said = set()  # one finding per reason and cell: its first line
        for line, what, lasting in _reaches(tree, modules, bound, owned):
            if (lasting or not own) and what not in said:
                said.add(what)
                findings.append(Finding(label, line, what, index, lasting))
    return findings


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
