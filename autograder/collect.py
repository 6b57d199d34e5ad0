"""Read a class's submissions: one folder or .zip per student, or nbgrader's submitted/ layout.

Nothing here runs student code. Each notebook is parsed and validated; one that is truncated or
not JSON is recorded as unreadable instead of reaching nbgrader (which would discard the
student's whole submission for it). A notebook handed in under another name is found by the grade
ids only it holds, or by its name (``_renamed``). Cells carrying nbgrader metadata that the assignment does
not have (foreign cells) lose that metadata, so nbgrader grades them as plain cells.

Cells whose nbgrader metadata is gone (an editor that drops it, cells pasted into a new notebook,
an answer cell deleted and the answer typed into a new one) get it back where the cell can be
told: by its text for what the student did not write (locked and test cells, a stub left as it
was), by its place for an answer (the student's cell between the same neighbours, one that
defines the stub's names, or the written answer). An answer written into a cell of its own beside
its answer cell, left as released, is graded there: a code stub run after it would replace it, and
nbgrader gives a written answer left as released 0 points without showing it. Graded or locked
cells still missing are put back from the release, where they stood: nbgrader's own
``add_missing_cells`` fails when two neighbours are missing (0.9.6: KeyError), and then nbgrader
discards the submission. nbgrader restores every such cell's source from its gradebook. An
answer cell's stub is never put back: it would replace an answer given elsewhere.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import copy
import datetime
import difflib
import functools
import hashlib
import importlib.util
import itertools
import json
import os
import re
import stat
import sys
import warnings
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from .files import UnsafeFile, read_regular, regular_files
from .screen import MODULES, imported_modules, is_module_name, is_script_name, package_of, run_scripts

STUDENT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@+-]{0,63}$")
MAX_NOTEBOOK_BYTES = 20 * 2**20  # what reaches nbgrader; a larger notebook loses its outputs first
MAX_READ_BYTES = 256 * 2**20  # what is read at all, of one notebook and of all a student's notebooks together
# objects and lists in a notebook's JSON, counted by their opening brackets before it is parsed: Python's objects
# take about 24 times the text's bytes for "[{},{},...]"; an honest notebook of 100 MB holds about 100,000
MAX_JSON_NODES = 2_000_000
MAX_JSON_DEPTH = 64  # a notebook nests about 8 levels; nbgrader and the grader's parsers recurse
MAX_ENTRIES = 10_000  # files and folders in a student's folder or zip, looked at before anything is read
# what nbgrader's exchange puts beside the notebooks: when it was handed in (late penalties) and the
# secret that names the student's feedback in the exchange
EXCHANGE_FILES = ("timestamp.txt", "submission_secret.txt")
MAX_MODULE_BYTES = 2**20  # a Python module handed in beside the notebooks (``_modules_beside``)
MAX_MODULES = 50
# what Jupyter adds to a notebook's name for its checkpoint, in .ipynb_checkpoints/ beside it
CHECKPOINT = "-checkpoint"


@dataclass
class Submission:
    student: str
    assignment: str = ""
    notebooks: dict[str, bytes] = field(default_factory=dict)  # name -> cleaned, valid notebook
    problems: dict[str, tuple[str, str]] = field(default_factory=dict)  # name -> (status, reason)
    notes: dict[str, str] = field(default_factory=dict)  # name -> what was repaired
    files: dict[str, bytes] = field(default_factory=dict)  # EXCHANGE_FILES found beside the notebooks
    graded_under: str = ""  # what grading depends on besides the notebooks (grade.grading_fingerprint)

    @property
    def digest(self) -> str:
        h = hashlib.sha256()
        for name in sorted(self.notebooks):
            h.update(name.encode() + b"\0" + self.notebooks[name])
        for name in sorted(self.files):
            h.update(name.encode() + b"\1" + self.files[name])
        h.update(json.dumps([self.problems, self.notes], sort_keys=True).encode())
        return h.hexdigest()


def _in_assignment(parts: tuple[str, ...], assignment: str, own_folder_only: bool, any_in_folder: bool) -> bool:
    """Whether a notebook at ``parts`` (its path inside the student's folder or zip) belongs to ``assignment``.

    nbgrader's layout puts the notebooks in a folder named for the assignment; where the student has
    such a folder only what is inside counts, and with several assignments nothing else does."""
    inside = assignment in parts[:-1]
    return inside or not (own_folder_only or any_in_folder)


def _files_of_folder(folder: Path, assignment: str,
                     own_folder_only: bool) -> tuple[dict[str, bytes | int], dict[str, bytes | str]]:
    """(the assignment's notebooks by name, the Python modules beside them: ``_modules_beside``)."""
    files = sorted(regular_files(folder, MAX_ENTRIES))  # never through a link: see files.py
    paths = [p for p in files if p.suffix == ".ipynb"]  # checkpoints too: see _renamed
    parts = [p.relative_to(folder).parts for p in paths]
    any_in_folder = any(assignment in q[:-1] for q in parts)
    chosen, taken = {}, []
    for path, q in zip(paths, parts, strict=True):
        if _in_assignment(q, assignment, own_folder_only, any_in_folder):
            taken.append(q)
            chosen.setdefault(path.stem, (path, os.lstat(path).st_size))
    _within_budget(size for _, size in chosen.values())
    found = {stem: size if size > MAX_READ_BYTES else read_regular(path, MAX_READ_BYTES)
             for stem, (path, size) in chosen.items()}
    # only the folders that hold a notebook taken: the tree was walked once already, for the notebooks
    modules = {}
    for where in sorted({folder.joinpath(*_ran_in(q)) for q in taken}):
        modules.update(_python_files(where, folder))
    return found, _modules_beside(taken, modules)


def _python_files(where: Path, root: Path) -> dict[tuple[str, ...], tuple]:
    """{path under ``root``: (size, read)} of the Python files a notebook in ``where`` may import or %run: those
    beside it and those of its packages, the folders named as modules (of a folder without __init__.py, which
    grading does not hand over, only the first file found: enough for the note that says so, without walking
    what may be a whole virtual environment)."""
    files = [p for p in sorted(where.glob("*.py")) if _is_regular(p)]
    for package in sorted(p for p in where.iterdir() if _is_regular(p, stat.S_ISDIR) and is_module_name(p.name)):
        below = (p for p in sorted(regular_files(package, MAX_ENTRIES)) if p.suffix == ".py")
        files += below if _is_regular(package / "__init__.py") else itertools.islice(below, 1)
    return {p.relative_to(root).parts: (os.lstat(p).st_size, functools.partial(read_regular, p, MAX_MODULE_BYTES))
            for p in files}


def _is_regular(path: Path, kind=stat.S_ISREG) -> bool:
    """Whether ``path`` is a regular file (or, with ``kind``, folder) itself, not a link to one."""
    try:
        return kind(os.lstat(path).st_mode)
    except OSError:
        return False


def _within_budget(sizes) -> None:
    """Refuse a submission whose notebooks hold more than MAX_READ_BYTES together, before any is read (one larger
    than that alone is not read, and says so itself)."""
    total = sum(size for size in sizes if size <= MAX_READ_BYTES)
    if total > MAX_READ_BYTES:
        raise UnsafeFile(f"its notebooks hold {total / 2**20:,.0f} MiB together, more than grading reads "
                         f"({MAX_READ_BYTES // 2**20} MiB)")


def modules_for_validate(notebook: bytes, folder: Path) -> tuple[dict[str, str], str]:
    """For a student's Validate of ``notebook`` in ``folder``: ({NAME: source} of the modules there that grading
    would hand it, by ``_modules_beside``'s rules, leaving out one that is not UTF-8 text, which cannot run;
    the note grading's row would give on the modules it imports and grading would not hand it, or "").
    So Validate screens what grading will run, reads no more of the folder than grading would, and says
    before grading what would fail there."""
    beside = _modules_beside([("notebook.ipynb",)], _python_files(folder, folder), beside=folder)
    sources = {}
    for name, source in beside.items():
        if isinstance(source, bytes):
            with contextlib.suppress(UnicodeDecodeError):
                sources[name] = source.decode("utf-8")
    return sources, _modules_not_handed_over(notebook, beside)


def _modules_beside(notebooks: list[tuple[str, ...]], modules: dict[tuple[str, ...], tuple],
                    beside: Path | None = None) -> dict[str, bytes | str]:
    """{NAME: source, or why it is not handed over} for the Python modules in a folder that holds one of the
    assignment's notebooks, which its cells import by name in the student's Jupyter (nbgrader hands them to
    the notebooks too), and for the files of the packages there (``mylib/__init__``, ``mylib/core``: a folder
    with __init__.py; a folder without one is named ``mylib/``, with why it is not handed over).
    ``modules``: {path: (size, read)}. Only names Python can import, or ``%run`` can
    (``is_script_name``: ``hw1-helpers.py``); a module or package that has an installed module's or the standard
    library's name is not handed over (the kernel's path puts the
    student's last: the notebook would get the other), nor one past MAX_MODULE_BYTES or MAX_MODULES. ``beside``:
    the folder the modules are in, where that is on this Python's path (Validate's): no module there counts as
    installed."""
    folders = {_ran_in(parts) for parts in notebooks}
    found: dict[str, bytes | str] = {}
    for parts, (size, read) in modules.items():
        for folder in sorted(f for f in folders if parts[:len(f)] == f):
            name = _module_name(parts[len(folder):], lambda top, f=folder: (*f, top, "__init__.py") in modules)
            if name is None or name in found or package_of(name) + "/" in found:
                continue
            top = package_of(name)
            if top in sys.stdlib_module_names or _installed(top, beside):
                found[name if name == top else top + "/"] = (
                    f"{'the standard library' if top in sys.stdlib_module_names else 'an installed package'} "
                    "has a module of that name, which the notebook gets instead when graded: rename it")
            elif name.endswith("/"):
                found[name] = "it has no __init__.py: with an empty one, grading hands the folder over as a package"
            elif size > MAX_MODULE_BYTES:
                found[name] = f"larger than {MAX_MODULE_BYTES // 2**20} MiB"
            elif sum(isinstance(v, bytes) for v in found.values()) >= MAX_MODULES:
                found[name] = f"more than {MAX_MODULES} modules were handed in"
            else:
                found[name] = read()
    return found


def _module_name(path: tuple[str, ...], is_package) -> str | None:
    """The name ``_modules_beside`` gives the file at ``path`` (under a notebook's folder), or None where no import
    or ``%run`` from that folder reaches it. ``is_package(top)``: whether folder ``top`` there has __init__.py."""
    *folders, file = path
    stem = file.removesuffix(".py")
    if not folders:
        return stem if is_script_name(stem) else None
    if not all(map(is_module_name, folders)) or not (is_module_name(stem) or stem == "__init__"):
        return None
    return "/".join([*folders, stem]) if is_package(folders[0]) else folders[0] + "/"


def _modules_not_handed_over(notebook: bytes, modules: dict[str, bytes | str]) -> str:
    """A note naming the student's modules that the notebook imports (itself or through another of theirs) and
    grading does not hand it, and why: its import then fails, or finds another module, for a reason the
    student's own Jupyter never showed."""
    if all(isinstance(source, bytes) for source in modules.values()):
        return ""  # every module handed over (or none handed in): nothing to read the notebook for
    sources = {name: source.decode("utf-8", errors="replace") if isinstance(source, bytes) else ""
               for name, source in modules.items()}
    nb = nbformat.reads(notebook.decode(), as_version=4)
    scripts = run_scripts(nb)[0]  # %run by file name
    return _joined(*(f"{'runs' if name in scripts else 'imports'} {name}{'' if name.endswith('/') else '.py'}, "
                     "handed in beside it, which grading "
                     f"does not hand over: {modules[name]}"
                     for name in sorted(imported_modules(nb, sources)) if isinstance(modules[name], str)))


def _installed(name: str, beside: Path | None = None) -> bool:
    """Whether ``import name`` finds a module in the grader's Python (a namespace package, which a folder in
    the working directory makes, is none; nor is a module in ``beside``). Finding one imports nothing for a
    name without dots."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return False
    if spec is None or spec.origin in (None, "namespace"):
        return False
    origin = Path(spec.origin).resolve()  # NAME.py, or NAME/__init__.py
    return beside is None or (origin.parent.parent if origin.stem == "__init__" else origin.parent) != beside.resolve()


def _exchange_files(folder: Path, assignment: str) -> dict[str, bytes]:
    """nbgrader's timestamp and submission secret, where the student's folder is in its layout."""
    found = {}
    for name in EXCHANGE_FILES:
        for path in sorted(folder.rglob(name)):
            if assignment and path.parent.name == assignment and name not in found:
                with contextlib.suppress(OSError):  # a link, a FIFO, or 4 KB or more: not nbgrader's
                    found[name] = read_regular(path, 4095)
    return found


def _files_of_zip(path: Path, assignment: str,
                  own_folder_only: bool) -> tuple[dict[str, bytes | int], dict[str, bytes | str]]:
    """(the assignment's notebooks by name, the Python modules beside them: ``_modules_beside``)."""
    found, taken = {}, []
    with zipfile.ZipFile(path) as archive:
        if len(archive.infolist()) > MAX_ENTRIES:
            raise UnsafeFile(f"it holds {len(archive.infolist()):,} entries, more than {MAX_ENTRIES:,}")
        files = [i for i in archive.infolist() if not i.is_dir() and "__MACOSX" not in Path(i.filename).parts]
        locked = [i.filename for i in files if i.flag_bits & 0x1]
        if locked:
            raise UnsafeFile(f"{locked[0]} in it is encrypted: hand the zip in without a password")
        infos = [i for i in files if Path(i.filename).suffix == ".ipynb"]
        any_in_folder = any(assignment in Path(i.filename).parts[:-1] for i in infos)
        chosen = {}
        for info in infos:
            name = Path(info.filename)
            if _in_assignment(name.parts, assignment, own_folder_only, any_in_folder):
                taken.append(name.parts)
                chosen.setdefault(name.stem, info)
        _within_budget(info.file_size for info in chosen.values())
        for stem, info in chosen.items():
            found[stem] = info.file_size if info.file_size > MAX_READ_BYTES else archive.read(info)
        modules = {Path(i.filename).parts: (i.file_size, functools.partial(archive.read, i))
                   for i in files if Path(i.filename).suffix == ".py"}
        return found, _modules_beside(taken, modules)


def _plain_name(stem: str) -> str:
    """A notebook's name without what downloads and copies add: "01_bias (1)", "01_bias-Copy1", "01_Bias_copy"."""
    stem = stem.lower().strip()
    while (shorter := re.sub(rf"(\s*\(\d+\)|[-_ ]copy\d*|-\d+|{CHECKPOINT})$", "", stem).strip()) != stem:
        stem = shorter
    return stem


def _decoded(raw: bytes) -> tuple[str, str]:
    """The notebook's text, and a note where it was not plain UTF-8. Jupyter writes UTF-8; a notebook edited
    on Windows comes back with a byte-order mark (Notepad, PowerShell's Set-Content), as UTF-16 (PowerShell's
    ``>``) or in the Windows code page, none of which Jupyter or nbgrader reads: the answers are in it all the
    same."""
    encoding = json.detect_encoding(raw)  # JSON's own rule: a byte-order mark, or where the zero bytes are
    try:
        text = raw.decode(encoding)
    except UnicodeDecodeError:
        return raw.decode("cp1252", errors="replace"), "read in the Windows code page (cp1252): it was not UTF-8"
    if encoding == "utf-8":
        return text, ""
    return text, f"read as {'UTF-8 with a byte-order mark' if encoding == 'utf-8-sig' else encoding.upper()}"


def _too_many_nodes(raw: bytes) -> bool:
    return raw.count(b"{") + raw.count(b"[") > MAX_JSON_NODES


def _grade_ids_in(raw: bytes) -> set[str]:
    if _too_many_nodes(raw):
        return set()
    try:
        cells = json.loads(_decoded(raw)[0]).get("cells", [])
        return {str(c["metadata"]["nbgrader"]["grade_id"]) for c in cells
                if isinstance(c, dict) and "grade_id" in c.get("metadata", {}).get("nbgrader", {})}
    except (ValueError, AttributeError, TypeError, RecursionError):
        return set()


def _renamed(files: dict[str, bytes], releases: dict) -> dict[str, str]:
    """For each notebook of the assignment not handed in under its name, the one handed in under another
    name that is it: the one holding most of the grade ids that are its alone (no other notebook of the
    assignment has them: "readonly-03" may be in every one), or, where none does, the one whose name is its
    name once what downloads and copies add is taken off ("01_bias (1)", "01_bias-Copy1"; an LMS's prefix).
    Best pairs first, each notebook given once; Jupyter's checkpoint of a notebook (``.ipynb_checkpoints/
    NAME-checkpoint.ipynb``, its last explicit save) only where no other notebook handed in is it."""
    ids = {name: {_grade_id(c) for c in release.cells} - {None} for name, release in releases.items()}
    missing = {name: own - set().union(*(ids[other] for other in ids if other != name))
               for name, own in ids.items() if name not in files}
    pairs = []
    for stem in (stem for stem in files if stem not in releases):
        held = _grade_ids_in(files[stem])
        for name, own in missing.items():
            likeness = (len(held & own), _plain_name(stem).endswith(_plain_name(name)))
            if any(likeness):
                pairs.append(((not _is_checkpoint(stem), *likeness), stem, name))
    found: dict[str, str] = {}
    for _, stem, name in sorted(pairs, reverse=True):
        if name not in found and stem not in found.values():
            found[name] = stem
    return found


def _is_checkpoint(stem: str) -> bool:
    return stem.endswith(CHECKPOINT)


def _ran_in(parts: tuple[str, ...]) -> tuple[str, ...]:
    """The folder a notebook at ``parts`` ran in, beside its modules: a checkpoint's, the one above
    .ipynb_checkpoints/."""
    return parts[:-2] if parts[-2:-1] == (".ipynb_checkpoints",) else parts[:-1]


def _grade_id(cell) -> str | None:
    return cell.metadata.get("nbgrader", {}).get("grade_id")


def _joined(*notes: str | None) -> str:
    """A row's notes, the empty ones left out."""
    return "; ".join(note for note in notes if note)


def _meta(nb, grade_id: str) -> dict:
    return next(c.metadata["nbgrader"] for c in nb.cells if _grade_id(c) == grade_id)


def _text(cell) -> tuple[str, str]:
    """What tells a cell whose metadata is gone: its type and its text, trailing blanks aside."""
    return cell.cell_type, "\n".join(line.rstrip() for line in cell.source.strip().splitlines())


def _parsed(source: str) -> ast.Module:
    try:
        return ast.parse(source)
    except SyntaxError:
        return ast.Module(body=[], type_ignores=[])


def _defined_names(source: str) -> set[str]:
    """The names a cell binds at its top level: functions, classes, assignments (none if it does not parse)."""
    names = set()
    for node in _parsed(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return names


def _answer_names(stub: str) -> set[str]:
    """The names an answer cell is for: what its stub defines, and what it reads without defining (the stub
    ``raise NotImplementedError()`` then ``print(sat_head1)`` is for ``sat_head1``)."""
    read = {n.id for n in ast.walk(_parsed(stub)) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return _defined_names(stub) | (read - set(dir(builtins)))


def _stubs(release) -> dict[str, tuple[str, str]]:
    """The answer cells as released (code stubs, "YOUR ANSWER HERE"), by grade id: their type and text."""
    return {_grade_id(c): _text(c) for c in release.cells if c.metadata.get("nbgrader", {}).get("solution")}


def _written_by_student(nb, release, cell_type: str, within: range) -> list[int]:
    """The plain cells of ``cell_type`` in ``within`` that the student wrote: not empty, and not a release
    cell's text (a question pasted again is nobody's answer)."""
    texts = {_text(c) for c in release.cells}
    return [k for k in within if _grade_id(nb.cells[k]) is None and nb.cells[k].cell_type == cell_type
            and nb.cells[k].source.strip() and _text(nb.cells[k]) not in texts]


def _longest(nb, cells: list[int]) -> list[int]:
    """The written answer among the student's markdown cells: the longest (none if there are none)."""
    return sorted(cells, key=lambda k: len(nb.cells[k].source.strip()))[-1:]


def _give_metadata(cell, released) -> None:
    cell.metadata["nbgrader"] = copy.deepcopy(released.metadata["nbgrader"])
    for key in ("deletable", "editable"):
        if key in released.metadata:
            cell.metadata[key] = released.metadata[key]


def _restore_lost_metadata(nb, release) -> list[str]:
    """Give the release's nbgrader metadata back to the student's cells that lost it; the grade ids restored.

    The two notebooks are aligned in order (``difflib``), cells with metadata by their grade id and the
    rest by their text: a plain cell whose text is a lost cell's release text is that cell. A lost answer
    cell is then looked for between the cells aligned before and after it: for code, the last plain cell
    there that defines a name its stub is for (``_answer_names``); for a written answer, the longest plain
    markdown cell."""
    present = {_grade_id(c) for c in nb.cells} - {None}
    if not {_grade_id(c) for c in release.cells} - {None} - present:
        return []
    released = [("id", _grade_id(c)) if _grade_id(c) in present else ("text", *_text(c)) for c in release.cells]
    submitted = [("id", _grade_id(c)) if _grade_id(c) else ("text", *_text(c)) for c in nb.cells]
    at: dict[int, int] = {}  # release cell -> the student's cell it is
    for a, b, size in difflib.SequenceMatcher(None, released, submitted, autojunk=False).get_matching_blocks():
        at.update((a + k, b + k) for k in range(size))
    restored = []
    for r, s in sorted(at.items()):
        if released[r][0] == "text" and _grade_id(release.cells[r]) is not None:
            _give_metadata(nb.cells[s], release.cells[r])
            restored.append(_grade_id(release.cells[r]))
    for r, cell in enumerate(release.cells):
        if r in at or not cell.metadata.get("nbgrader", {}).get("solution") or _grade_id(cell) in present:
            continue
        start = max((s for q, s in at.items() if q < r), default=-1)
        stop = min((s for q, s in at.items() if q > r), default=len(nb.cells))
        mine = _written_by_student(nb, release, cell.cell_type, range(start + 1, stop))
        if cell.cell_type == "code":
            names = _answer_names(cell.source)
            mine = [s for s in mine if names & _defined_names(nb.cells[s].source)][-1:]
        for s in mine if cell.cell_type == "code" else _longest(nb, mine):
            _give_metadata(nb.cells[s], cell)  # given, it is no longer a plain cell: no other answer takes it
            at[r] = s
            restored.append(_grade_id(cell))
    return restored


def _answers_beside_stubs(nb, release) -> list[str]:
    """Answer cells left as released, the answer written into a plain cell beside them: that cell becomes the
    answer cell and the stub goes. For code, a cell above that defines the stub's names (the stub, run after
    it, would replace the answer); for a written answer, the longest plain markdown cell between the
    stub's graded or locked neighbours (nbgrader gives a written answer left as released 0 points, unseen)."""
    stubs = _stubs(release)
    moved = []
    for n, cell in reversed(list(enumerate(nb.cells))):
        grade_id = _grade_id(cell)
        if grade_id not in stubs or _text(cell) != stubs[grade_id]:
            continue
        if cell.cell_type == "code":
            names = _defined_names(cell.source)
            mine = [k for k in _written_by_student(nb, release, "code", range(n))
                    if names and names <= _defined_names(nb.cells[k].source)][-1:]
        else:
            graded = [k for k, c in enumerate(nb.cells) if _grade_id(c) is not None and k != n]
            start = max((k for k in graded if k < n), default=-1)
            stop = min((k for k in graded if k > n), default=len(nb.cells))
            mine = _longest(nb, _written_by_student(nb, release, "markdown", range(start + 1, stop)))
        for k in mine:
            _give_metadata(nb.cells[k], cell)
            del nb.cells[n]
            moved.append(grade_id)
    return moved


def _drop_pasted_stubs(nb, release) -> int:
    """Remove the student's plain cells that are an answer cell's code stub as released (a copy and paste of
    the answer cell, the answer written into the other copy): run after the answer, one would replace it."""
    stubs = {text for text in _stubs(release).values() if text[0] == "code"}
    kept = [c for c in nb.cells if _grade_id(c) is not None or _text(c) not in stubs]
    pasted, nb.cells = len(nb.cells) - len(kept), kept
    return pasted


def _put_back_deleted(nb, release) -> list[str]:
    """Insert the release's version of every graded or locked cell missing from ``nb``, after its release
    neighbour. An answer cell's stub is not put back: run after an answer given elsewhere, it would replace it."""
    present = {_grade_id(c) for c in nb.cells} - {None}
    put_back = []
    for n, cell in enumerate(release.cells):
        grade_id = _grade_id(cell)
        meta = cell.metadata.get("nbgrader", {})
        if grade_id is None or grade_id in present or (meta.get("solution") and not meta.get("grade")):
            continue
        before = [_grade_id(c) for c in release.cells[:n] if _grade_id(c) in present]
        at = next((k + 1 for k, c in enumerate(nb.cells) if before and _grade_id(c) == before[-1]), 0)
        nb.cells.insert(at, nbformat.from_dict(cell))
        present.add(grade_id)
        put_back.append(grade_id)
    return put_back


@contextlib.contextmanager
def _new_ids_quietly():
    """nbformat gives a cell whose id repeats another's (a pasted cell), or that has none, a new one, and warns:
    for each notebook, on the instructor's console, where it says nothing to act on."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", nbformat.warnings.DuplicateCellId)
        warnings.simplefilter("ignore", nbformat.warnings.MissingIDFieldWarning)
        yield


def _without_outputs(raw: bytes) -> tuple[bytes, str]:
    """A notebook past MAX_NOTEBOOK_BYTES without its outputs and saved widget state, which grading does not
    read (it runs every cell again): a printing loop or many plots made honest notebooks that large."""
    if _too_many_nodes(raw):
        return raw, ""
    try:
        nb = json.loads(_decoded(raw)[0])
        for cell in nb["cells"]:
            if "outputs" in cell:
                cell["outputs"], cell["execution_count"] = [], None
        nb.get("metadata", {}).pop("widgets", None)
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return raw, ""  # not a notebook: the checks below say why
    smaller = json.dumps(nb, ensure_ascii=False).encode()
    return smaller, f"cleared its outputs first ({len(raw) / 2**20:.0f} MiB in all; grading runs every cell again)"


def _depth(node) -> int:
    """How deeply lists and objects nest in parsed JSON, counted without recursion."""
    deepest, todo = 0, [(node, 1)]
    while todo:
        node, level = todo.pop()
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        deepest = max(deepest, level)
        todo += [(child, level + 1) for child in children if isinstance(child, (dict, list))]
    return deepest


def _clean(raw: bytes | int, release) -> tuple[bytes | None, str]:
    """(the notebook to grade, a note), or (None, why it cannot be graded). ``raw``: the file, or the size of
    one past MAX_READ_BYTES, which is not read."""
    if isinstance(raw, int):
        return None, f"larger than {MAX_READ_BYTES // 2**20} MiB ({raw / 2**20:,.0f} MiB)"
    if _too_many_nodes(raw):
        return None, f"not a notebook: its JSON holds more than {MAX_JSON_NODES:,} objects and lists"
    notes = []
    if len(raw) > MAX_NOTEBOOK_BYTES:
        raw, cleared = _without_outputs(raw)
        notes += [cleared] if cleared else []
        if len(raw) > MAX_NOTEBOOK_BYTES:
            return None, f"larger than {MAX_NOTEBOOK_BYTES // 2**20} MiB without its outputs"
    text, read_as = _decoded(raw)
    notes += [read_as] if read_as else []
    try:
        with _new_ids_quietly():
            nb = nbformat.reads(text, as_version=4)
        nbformat.validate(nb)
    except json.JSONDecodeError as err:
        return None, f"not a notebook: the file is not valid JSON ({err})"
    except RecursionError:
        return None, f"not a notebook: its JSON is nested deeper than grading reads ({MAX_JSON_DEPTH} levels)"
    except Exception as err:  # nbformat's ValidationError and friends
        return None, f"not a valid notebook: {str(err).splitlines()[0]}"
    if _depth(nb) > MAX_JSON_DEPTH:
        return None, f"not a notebook: its JSON is nested deeper than grading reads ({MAX_JSON_DEPTH} levels)"
    grade_ids = {_grade_id(c) for c in release.cells} - {None}
    foreign, copies, seen = [], [], set()
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader")
        if meta is not None and (meta.get("grade_id") not in grade_ids or meta.get("grade_id") in seen):
            (copies if meta.get("grade_id") in seen else foreign).append(str(meta.get("grade_id")))
            del cell.metadata["nbgrader"]
        elif meta is not None:
            seen.add(meta["grade_id"])
    if foreign:
        notes.append(f"ignored the grading metadata of cells not in the assignment: {', '.join(foreign)}")
    if copies:
        notes.append(f"graded the first of two cells with the grading metadata of {', '.join(copies)} (a copy and "
                     "paste keeps it); the second stays, as a cell of the student's own")
    restored = _restore_lost_metadata(nb, release)
    if restored:
        graded = [g for g in restored if (meta := _meta(release, g)).get("grade") or meta.get("solution")]
        notes.append(f"gave back the grading metadata {len(restored)} cell(s) had lost"
                     + (f", the graded and answer cells among them: {', '.join(graded)}" if graded else ""))
    moved = _answers_beside_stubs(nb, release)
    if moved:
        notes.append(f"graded the answer written beside its answer cell, which was left as released: "
                     f"{', '.join(moved)}")
    pasted = _drop_pasted_stubs(nb, release)
    if pasted:
        notes.append(f"left out {pasted} copies of answer cells as released, which would replace the answers")
    put_back = _put_back_deleted(nb, release)
    if put_back:
        notes.append(f"put back deleted cells: {', '.join(put_back)}")
    with _new_ids_quietly():  # a cell put back beside a student's cell with its id
        return nbformat.writes(nb).encode(), _joined(*notes)


def _newest_notebook(entry: Path) -> float:
    """When ``entry`` (a folder, a zip or a notebook) was last handed in: the time of its newest notebook."""
    if entry.suffix == ".zip":
        with zipfile.ZipFile(entry) as archive:
            times = [datetime.datetime(*i.date_time).timestamp() for i in archive.infolist()
                     if i.filename.endswith(".ipynb")]
    elif entry.is_dir():
        times = [p.stat().st_mtime for p in entry.rglob("*.ipynb")]
    else:
        times = []
    return max(times, default=entry.stat().st_mtime)


def _entries(folder: Path) -> list[tuple[str, Path, list[str]]]:
    """(student id, the entry to grade, the student's other entries) for each student in ``folder``: a folder,
    a .zip or a notebook named for the student. A student handed in twice (a zip beside its unpacked folder,
    a re-upload) is graded from the newest: graded twice, the two runs raced for one gradebook row."""
    by_student: dict[str, list[Path]] = {}
    for entry in sorted(folder.iterdir()):
        if not entry.name.startswith(".") and (entry.is_dir() or entry.suffix in (".zip", ".ipynb")):
            by_student.setdefault(entry.name if entry.is_dir() else entry.stem, []).append(entry)
    chosen = []
    for student, entries in by_student.items():
        if len(entries) > 1:
            try:
                entries = sorted(entries, key=_newest_notebook)
            except (zipfile.BadZipFile, OSError):
                pass  # one of them cannot be read: the last in name order, which then says why
        chosen.append((student, entries[-1], [e.name + "/" * e.is_dir() for e in entries[:-1]]))
    return chosen


def collect(folder: Path, notebooks: dict[str, Path], assignment: str = "", *,
            own_folder_only: bool = False) -> list[Submission]:
    """Every student's submission of ``assignment`` in ``folder``.

    ``notebooks`` maps each notebook's name to its release version. A student's notebooks may lie
    anywhere in their folder or zip, unless they have a folder named for the assignment (nbgrader's
    layout): then only that one counts, and with ``own_folder_only`` (several assignments graded
    together) it must be there."""
    if not folder.is_dir():
        raise FileNotFoundError(f"submissions folder {folder} does not exist")
    releases = {name: nbformat.read(path, as_version=4) for name, path in notebooks.items()}
    class_ = []
    for student, entry, others in _entries(folder):
        submission = Submission(student, assignment)
        class_.append(submission)
        try:
            _read_submission(submission, entry, others, releases, own_folder_only)
        except Exception as err:  # whatever a student's files do to the reading, it costs that student alone
            why = (str(err) if isinstance(err, (zipfile.BadZipFile, OSError))
                   else f"nested deeper than grading reads ({type(err).__name__})" if isinstance(err, RecursionError)
                   else f"{type(err).__name__}: {err}")
            submission.notebooks.clear()
            for name in releases:
                submission.problems[name] = ("unreadable", f"cannot read {entry.name}: {why}"[:500])
    return [s for s in class_ if s.student]


def _read_submission(submission: Submission, entry: Path, others: list[str], releases: dict,
                     own_folder_only: bool) -> None:
    """Fill ``submission`` from the student's ``entry``: a folder, a zip or one notebook."""
    assignment = submission.assignment
    if entry.is_symlink():
        raise UnsafeFile("a symbolic link, which grading does not follow")
    if not STUDENT_ID.match(submission.student):
        for name in releases:
            submission.problems[name] = ("invalid", f"{entry.name!r} is not a usable student id")
        return
    if entry.suffix == ".zip":
        files, modules = _files_of_zip(entry, assignment, own_folder_only)
    elif entry.is_dir():
        files, modules = _files_of_folder(entry, assignment, own_folder_only)
        submission.files = _exchange_files(entry, assignment)
    else:  # one notebook, named for the student: which of the assignment's it is, its grade ids say
        files, modules = {entry.stem: read_regular(entry, MAX_READ_BYTES)}, {}
    submission.files.update({f"{MODULES}/{name}.py": source for name, source in modules.items()
                             if isinstance(source, bytes)})
    renamed = _renamed(files, releases)
    # a checkpoint left over beside its notebook is no notebook handed in in its own right
    unused = sorted(stem for stem in set(files) - set(releases) - set(renamed.values()) if not _is_checkpoint(stem))
    for name, release in releases.items():
        handed_in = renamed.get(name, name)
        if handed_in not in files:  # missing: say what was handed in instead, for the instructor to look at
            if unused:
                submission.notes[name] = ("handed in, and taken for none of the assignment's notebooks: "
                                          + ", ".join(f"{stem}.ipynb" for stem in unused))
            continue
        cleaned, note = _clean(files[handed_in], release)
        if handed_in != name:
            note = _joined(f"graded {handed_in}.ipynb as {name}.ipynb"
                           + (" (Jupyter's last checkpoint of it: the notebook itself was not handed in)"
                              if _is_checkpoint(handed_in) else ""), note)
        if cleaned is None:
            submission.problems[name] = ("unreadable", note)
        else:
            submission.notebooks[name] = cleaned
            note = _joined(note, _modules_not_handed_over(cleaned, modules))
            if note:
                submission.notes[name] = note
    if others:
        twice = f"handed in {len(others) + 1} times: graded {entry.name}, the newest, not {', '.join(others)}"
        for name in releases:
            submission.notes[name] = _joined(twice, submission.notes.get(name))
