"""Read a class's submissions: one folder or .zip per student, or nbgrader's submitted/ layout.

Nothing here runs student code. Each notebook is parsed and validated; one that is truncated or
not JSON is recorded as unreadable instead of reaching nbgrader (which would discard the
student's whole submission for it). Cells carrying nbgrader metadata that the assignment does
not have (foreign cells) lose that metadata, so nbgrader grades them as plain cells.
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


@dataclass
class Submission:
    student: str
    notebooks: dict[str, bytes] = field(default_factory=dict)  # name -> cleaned, valid notebook
    problems: dict[str, tuple[str, str]] = field(default_factory=dict)  # name -> (status, reason)
    notes: dict[str, str] = field(default_factory=dict)  # name -> what was repaired

    @property
    def digest(self) -> str:
        h = hashlib.sha256()
        for name in sorted(self.notebooks):
            h.update(name.encode() + b"\0" + self.notebooks[name])
        h.update(json.dumps([self.problems, self.notes], sort_keys=True).encode())
        return h.hexdigest()


def _files_of_folder(folder: Path) -> dict[str, bytes]:
    # nbgrader's layout puts the notebooks one level down, in a folder named for the assignment
    found = {}
    for path in sorted(folder.rglob("*.ipynb")):
        if ".ipynb_checkpoints" in path.parts or not path.is_file():
            continue
        found.setdefault(path.stem, path.read_bytes()[: MAX_NOTEBOOK_BYTES + 1])
    return found


def _files_of_zip(path: Path) -> dict[str, bytes]:
    found = {}
    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            name = Path(info.filename)
            if info.is_dir() or name.suffix != ".ipynb" or "__MACOSX" in name.parts:
                continue
            if info.file_size > MAX_NOTEBOOK_BYTES:
                found.setdefault(name.stem, b"\0" * (MAX_NOTEBOOK_BYTES + 1))
                continue
            found.setdefault(name.stem, archive.read(info))
    return found


def _clean(raw: bytes, grade_ids: set[str]) -> tuple[bytes | None, str]:
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
    foreign = []
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader")
        if meta is not None and meta.get("grade_id") not in grade_ids:
            foreign.append(str(meta.get("grade_id")))
            del cell.metadata["nbgrader"]
    note = f"ignored the grading metadata of cells not in the assignment: {', '.join(foreign)}" if foreign else ""
    return nbformat.writes(nb).encode(), note


def collect(folder: Path, notebooks: dict[str, set[str]]) -> list[Submission]:
    """Every student's submission in ``folder``; ``notebooks`` maps each notebook to its grade ids."""
    if not folder.is_dir():
        raise FileNotFoundError(f"submissions folder {folder} does not exist")
    class_ = []
    for entry in sorted(folder.iterdir()):
        if entry.name.startswith("."):
            continue
        student = entry.stem if entry.suffix == ".zip" else entry.name
        submission = Submission(student)
        class_.append(submission)
        if not STUDENT_ID.match(student):
            for name in notebooks:
                submission.problems[name] = ("invalid", f"{entry.name!r} is not a usable student id")
            continue
        try:
            files = _files_of_zip(entry) if entry.suffix == ".zip" else _files_of_folder(entry)
        except (zipfile.BadZipFile, OSError) as err:
            for name in notebooks:
                submission.problems[name] = ("unreadable", f"cannot read {entry.name}: {err}")
            continue
        for name, grade_ids in notebooks.items():
            if name not in files:
                continue
            cleaned, note = _clean(files[name], grade_ids)
            if cleaned is None:
                submission.problems[name] = ("unreadable", note)
            else:
                submission.notebooks[name] = cleaned
                if note:
                    submission.notes[name] = note
    return [s for s in class_ if s.student]
