"""Read a class's submissions: one folder or .zip per student, or nbgrader's submitted/ layout.

Nothing here runs student code. Each notebook is parsed and validated; one that is truncated or
not JSON is recorded as unreadable instead of reaching nbgrader (which would discard the
student's whole submission for it). Cells carrying nbgrader metadata that the assignment does
not have (foreign cells) lose that metadata, so nbgrader grades them as plain cells. Graded or
locked cells the student deleted are put back from the release, where they stood: nbgrader's
own ``add_missing_cells`` fails when two neighbours are missing (0.9.6: KeyError), and then
nbgrader discards the submission. nbgrader restores every such cell's source from its gradebook.
"""

from __future__ import annotations

import hashlib
import json
import re
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

STUDENT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@+-]{0,63}$")
MAX_NOTEBOOK_BYTES = 20 * 2**20
# what nbgrader's exchange puts beside the notebooks: when it was handed in (late penalties) and the
# secret that names the student's feedback in the exchange
EXCHANGE_FILES = ("timestamp.txt", "submission_secret.txt")


@dataclass
class Submission:
    student: str
    assignment: str = ""
    notebooks: dict[str, bytes] = field(default_factory=dict)  # name -> cleaned, valid notebook
    problems: dict[str, tuple[str, str]] = field(default_factory=dict)  # name -> (status, reason)
    notes: dict[str, str] = field(default_factory=dict)  # name -> what was repaired
    files: dict[str, bytes] = field(default_factory=dict)  # EXCHANGE_FILES found beside the notebooks

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


def _files_of_folder(folder: Path, assignment: str, own_folder_only: bool) -> dict[str, bytes]:
    paths = [p for p in sorted(folder.rglob("*.ipynb")) if ".ipynb_checkpoints" not in p.parts and p.is_file()]
    parts = [p.relative_to(folder).parts for p in paths]
    any_in_folder = any(assignment in q[:-1] for q in parts)
    found = {}
    for path, q in zip(paths, parts, strict=True):
        if _in_assignment(q, assignment, own_folder_only, any_in_folder):
            found.setdefault(path.stem, path.read_bytes()[: MAX_NOTEBOOK_BYTES + 1])
    return found


def _exchange_files(folder: Path, assignment: str) -> dict[str, bytes]:
    """nbgrader's timestamp and submission secret, where the student's folder is in its layout."""
    found = {}
    for name in EXCHANGE_FILES:
        for path in sorted(folder.rglob(name)):
            if assignment and path.parent.name == assignment and path.stat().st_size < 4096:
                found.setdefault(name, path.read_bytes())
    return found


def _files_of_zip(path: Path, assignment: str, own_folder_only: bool) -> dict[str, bytes]:
    found = {}
    with zipfile.ZipFile(path) as archive:
        infos = [i for i in archive.infolist() if not i.is_dir() and Path(i.filename).suffix == ".ipynb"
                 and "__MACOSX" not in Path(i.filename).parts]
        any_in_folder = any(assignment in Path(i.filename).parts[:-1] for i in infos)
        for info in infos:
            name = Path(info.filename)
            if not _in_assignment(name.parts, assignment, own_folder_only, any_in_folder):
                continue
            if info.file_size > MAX_NOTEBOOK_BYTES:
                found.setdefault(name.stem, b"\0" * (MAX_NOTEBOOK_BYTES + 1))
                continue
            found.setdefault(name.stem, archive.read(info))
    return found


def _grade_id(cell) -> str | None:
    return cell.metadata.get("nbgrader", {}).get("grade_id")


def _put_back_deleted(nb, release) -> list[str]:
    """Insert the release's version of every nbgrader cell missing from ``nb``, after its release neighbour."""
    present = {_grade_id(c) for c in nb.cells} - {None}
    put_back = []
    for n, cell in enumerate(release.cells):
        grade_id = _grade_id(cell)
        if grade_id is None or grade_id in present:
            continue
        before = [_grade_id(c) for c in release.cells[:n] if _grade_id(c) in present]
        at = next((k + 1 for k, c in enumerate(nb.cells) if before and _grade_id(c) == before[-1]), 0)
        nb.cells.insert(at, nbformat.from_dict(cell))
        present.add(grade_id)
        put_back.append(grade_id)
    return put_back


def _clean(raw: bytes, release) -> tuple[bytes | None, str]:
    """(the notebook to grade, a note), or (None, why it cannot be graded)."""
    if len(raw) > MAX_NOTEBOOK_BYTES:
        return None, f"larger than {MAX_NOTEBOOK_BYTES // 2**20} MiB"
    try:
        nb = nbformat.reads(raw.decode("utf-8"), as_version=4)
        nbformat.validate(nb)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        return None, f"not a notebook: the file is not valid JSON ({err})"
    except Exception as err:  # nbformat's ValidationError and friends
        return None, f"not a valid notebook: {str(err).splitlines()[0]}"
    grade_ids = {_grade_id(c) for c in release.cells} - {None}
    foreign, seen = [], set()
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader")
        if meta is not None and (meta.get("grade_id") not in grade_ids or meta.get("grade_id") in seen):
            foreign.append(str(meta.get("grade_id")))  # not the assignment's, or a second copy of one
            del cell.metadata["nbgrader"]
        elif meta is not None:
            seen.add(meta["grade_id"])
    notes = []
    if foreign:
        notes.append(f"ignored the grading metadata of cells not in the assignment: {', '.join(foreign)}")
    put_back = _put_back_deleted(nb, release)
    if put_back:
        notes.append(f"put back deleted cells: {', '.join(put_back)}")
    return nbformat.writes(nb).encode(), "; ".join(notes)


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
    for entry in sorted(folder.iterdir()):
        if entry.name.startswith("."):
            continue
        student = entry.stem if entry.suffix == ".zip" else entry.name
        submission = Submission(student, assignment)
        class_.append(submission)
        if not STUDENT_ID.match(student):
            for name in notebooks:
                submission.problems[name] = ("invalid", f"{entry.name!r} is not a usable student id")
            continue
        try:
            files = (_files_of_zip(entry, assignment, own_folder_only) if entry.suffix == ".zip"
                     else _files_of_folder(entry, assignment, own_folder_only))
            if entry.is_dir():
                submission.files = _exchange_files(entry, assignment)
        except (zipfile.BadZipFile, OSError) as err:
            for name in notebooks:
                submission.problems[name] = ("unreadable", f"cannot read {entry.name}: {err}")
            continue
        for name, release in releases.items():
            if name not in files:
                continue
            cleaned, note = _clean(files[name], release)
            if cleaned is None:
                submission.problems[name] = ("unreadable", note)
            else:
                submission.notebooks[name] = cleaned
                if note:
                    submission.notes[name] = note
    return [s for s in class_ if s.student]
