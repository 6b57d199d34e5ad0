"""The course, made ready once per run: each assignment's source generated with nbgrader, the reference's values
for its checks, and JAX's compilation cache, each rebuilt only when what it is built from changed."""

from __future__ import annotations

import errno
import fcntl
import hashlib
import importlib
import json
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from .workspace import (
    Settings,
    cases_file,
    checks_module,
    checks_package,
    compile_cache_dir,
    expected_dir,
    hidden_cases_key,
    nbgrader_api,
    notebook_policy,
    views_dir,
)


def tree_hash(folder: Path, pattern: str = "*") -> str:
    digest = hashlib.sha256()
    for path in sorted(folder.rglob(pattern)):
        if path.is_file():
            digest.update(str(path.relative_to(folder)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


# the machine's faults, not the course's: every assignment would fail alike, and rows that call the course broken
# would send the instructor to fix the wrong thing, so the run stops and says what happened (MachineFault)
MACHINE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO, errno.ENOMEM, errno.EMFILE,
                            errno.ENFILE})


class MachineFault(RuntimeError):
    """Grading stopped while the course was made ready, by a fault of the machine (a full disk, no memory)."""


# how those faults read once a library has turned them into text (shutil.Error's list, nbgrader's log, sqlite)
MACHINE_WORDS = re.compile("|".join(map(re.escape, [*(os.strerror(n) for n in MACHINE_ERRNOS),
                                                    "database or disk is full", "MemoryError"])))


def _is_machine_fault(err: BaseException | None) -> bool:
    """Whether ``err``, or what it was raised from, is a fault of the machine."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, MemoryError) or (isinstance(err, OSError) and err.errno in MACHINE_ERRNOS):
            return True
        if MACHINE_WORDS.search(str(err)):
            return True
        err = err.__cause__ or err.__context__
    return False


def _stop_for(err: BaseException, doing: str) -> MachineFault:
    return MachineFault(f"grading stopped while {doing}, before any student's notebook ran: {err!r}; run the same "
                        "command again once that is fixed")


@dataclass
class Prepared:
    releases: dict[str, dict[str, Path]]  # {assignment: {notebook name: its generated release version}}
    # {assignment: why it could not be made ready}: its students' rows say so, and the other assignments are graded
    failed: dict[str, str] = field(default_factory=dict)


def prepare_course(s: Settings) -> Prepared:
    """Copy each assignment's source in and generate it with nbgrader (only when it changed), with what grading
    it needs beside it. An assignment that cannot be made ready costs that assignment, not the run: its
    notebooks are the source's, for the rows that say why."""
    prepared = Prepared({})
    try:
        root_hash = copy_root_files(s.course, s.output / "course")
    except Exception as err:
        if _is_machine_fault(err):
            raise _stop_for(err, "copying the course's root files") from err
        raise
    for assignment in s.course.assignments:
        try:
            releases = _prepare_assignment(s, assignment, root_hash)
        except Exception as err:  # the instructor's to fix: said in each of the assignment's rows
            if _is_machine_fault(err):
                raise _stop_for(err, f"making assignment {assignment} ready") from err
            prepared.failed[assignment] = f"the course's assignment {assignment} could not be made ready: {err}"[:1000]
            shutil.rmtree(s.output / "course" / "release" / assignment, ignore_errors=True)
            releases = {p.stem: p for p in sorted((s.course.source / assignment).glob("*.ipynb"))}
        prepared.releases[assignment] = releases
    (s.output / "state" / "course.json").write_text(json.dumps({
        "course_id": s.course.course_id, "assignments": list(s.course.assignments),
        "source": str(s.course.source), "config_file": str(s.course.config_file or ""), "db_url": s.db_url}))
    return prepared


def _prepare_assignment(s: Settings, assignment: str, root_hash: str) -> dict[str, Path]:
    source = s.output / "course" / "source" / assignment
    marker = s.output / "state" / f"{assignment}.source.sha256"
    source_hash = tree_hash(s.course.source / assignment)
    wanted = source_hash + root_hash + s.db_url + s.course.course_id
    if not (marker.exists() and marker.read_text() == wanted and source.exists()):
        marker.unlink(missing_ok=True)
        shutil.rmtree(source, ignore_errors=True)
        shutil.copytree(s.course.source / assignment, source)
        result = nbgrader_api(s).generate_assignment(assignment, force=True)
        if not result["success"]:
            said = result["log"] + (result.get("error") or "")
            raise RuntimeError(f"nbgrader generate_assignment failed: {_first_error(said)}")
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(wanted)
    _prepare_expected_values(s, assignment, source_hash)
    prepare_kernel_files(s, assignment, source_hash)
    prepare_compile_cache(s, assignment, source_hash)
    release = s.output / "course" / "release" / assignment
    return {p.stem: p for p in sorted(release.glob("*.ipynb"))}


def _first_error(log: str) -> str:
    """The line of nbgrader's log that says what went wrong: the first exception it shows (its later ones say
    "see the above traceback"), else its last line."""
    raised = re.search(r"^\s*(?:[\w]+\.)*(\w+(?:Error|Exception): .+)$", log, re.MULTILINE)
    lines = [line.strip() for line in log.strip().splitlines() if line.strip()]
    return (raised.group(1) if raised else (lines or ["(no log)"])[-1])[-500:]


def copy_root_files(course, to_root: Path) -> str:
    """The course root's files that its configuration names relative to the root (``Course.root_files``), copied to
    the same places under ``to_root``, where nbgrader reads them when it works there; their digest."""
    names = course.root_files()
    for name in names:
        (to_root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(course.config_file.parent / name, to_root / name)
    return root_files_hash(course, names)


def root_files_hash(course, names: list[str] | None = None) -> str:
    """The digest of the root files ``names`` (default: ``course.root_files()``, which runs its configuration)."""
    digest = hashlib.sha256()
    for name in course.root_files() if names is None else names:
        digest.update(name.encode() + b"\0" + (course.config_file.parent / name).read_bytes())
    return digest.hexdigest()


def _rebuild_if_changed(key: Path, wanted: str, build) -> None:
    """Run ``build`` unless ``key`` records ``wanted``, the fingerprint of what it builds from, and record it
    after a build that does not return False. Under a lock beside the key: Dask workers on one machine
    share their compilation cache, and one of them fills it."""
    key.parent.mkdir(parents=True, exist_ok=True)
    with open(key.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if key.exists() and key.read_text() == wanted:
            return
        key.unlink(missing_ok=True)
        if build() is not False:
            key.write_text(wanted)


def _prepare_expected_values(s: Settings, assignment: str, source_hash: str) -> None:
    """The reference's values for the assignment's checks, computed here once (while the assignment's
    source and the checks' code stay as they are) instead of by every judging process."""
    from .verdicts import read_secret, save_expected_values

    module, package = checks_module(s), checks_package(s)
    if not module:
        return
    key = hidden_cases_key(s)
    values = expected_dir(s) / f"{assignment}.pickle"

    def build() -> bool:
        values.unlink(missing_ok=True)
        return save_expected_values(module, s.output / "course" / "source" / assignment, values, read_secret(key))

    secret_hash = hashlib.sha256(key.read_bytes()).hexdigest()
    _rebuild_if_changed(expected_dir(s) / f"{assignment}.key", source_hash + tree_hash(package, "*.py") + secret_hash,
                        build)


def prepare_kernel_files(s: Settings, assignment: str, source_hash: str) -> None:
    """What the sandbox shows each kernel of the assignment: the cases' inputs of every check its test cells make
    (hidden ones drawn with the grader's secret) and the course's views of its package, one per set of helpers
    (the course's ``write_cases`` and ``write_view``; a course without them has neither)."""
    from .verdicts import read_secret, source_check_calls

    module, package = checks_module(s), checks_package(s)
    if not module or not hasattr(grading := importlib.import_module(module), "write_view"):
        return
    key = hidden_cases_key(s)
    source = s.output / "course" / "source" / assignment

    def build() -> None:
        calls = source_check_calls(source)
        views = views_dir(s, assignment)
        shutil.rmtree(views, ignore_errors=True)
        for key_ in sorted(set(grading.views_of(calls).values()) | {grading.BARE}):
            grading.write_view(views / key_, grading.helpers_in(key_))
        cases_file(s, assignment).parent.mkdir(parents=True, exist_ok=True)
        grading.write_cases(cases_file(s, assignment), calls, read_secret(key))

    secret_hash = hashlib.sha256(key.read_bytes()).hexdigest()
    _rebuild_if_changed(views_dir(s, assignment).with_suffix(".key"),
                        source_hash + tree_hash(package, "*.py") + secret_hash, build)


def prepare_compile_cache(s: Settings, assignment: str, source_hash: str) -> None:
    """JAX's compilation cache for the assignment, filled from its released notebooks (compile_cache.py)
    once while the source and JAX stay as they are."""
    from importlib.metadata import PackageNotFoundError, version

    from . import compile_cache

    try:
        jax = version("jaxlib")
    except PackageNotFoundError:
        return
    # the release, never the source: a program compiled from a solution, in a kernel's copy of the cache, would be
    # the reference in another form (JAX can load and run a cached executable by hand)
    release = s.output / "course" / "release" / assignment
    _rebuild_if_changed(compile_cache_dir(s) / f"{assignment}.key", source_hash + jax + "release",
                        lambda: compile_cache.fill(release, compile_cache_dir(s) / assignment,
                                                   lambda path: notebook_policy(s, assignment, path), s.cell_timeout))
