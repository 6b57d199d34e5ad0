"""The instructor's side of nbgrader's exchange around a grading run: collect, then feedback.

    python -m autograder collect --course COURSE_ROOT [--assignment NAME]
    python -m autograder grade COURSE_ROOT/submitted --course COURSE_ROOT --output OUT
    (grade the written answers by hand in formgrader, or through nbgrader's Gradebook API)
    python -m autograder feedback --output OUT [--release]
    python -m autograder export --output OUT

Collecting and releasing are nbgrader's own: ``collect`` runs nbgrader's collect in the course root
(its exchange, as its nbgrader_config.py says); ``feedback`` regenerates every student's feedback
from the gradebook (so it carries the points given by hand), without hidden tests, and with
``--release`` puts it in the exchange with nbgrader's release_feedback, from which students get it
with ``nbgrader fetch_feedback``. The grading run keeps each submission's timestamp and
submission secret, so the released pages are the ones nbgrader's fetch_feedback looks for.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import pwd
import shutil
import warnings
from pathlib import Path

from nbgrader.exchange.default.collect import ExchangeCollect
from nbgrader.utils import ignore_patterns
from traitlets import Enum

from .course import CONFIG_FILE, load_config


def _check(result: dict, what: str) -> str:
    if not result["success"]:
        raise RuntimeError(f"nbgrader {what} failed:\n{result.get('log', '')}\n{result.get('error', '')}")
    return result.get("log", "")


def collect(course_root: Path, assignments) -> str:
    """nbgrader's collect, in the course root: every submission in its exchange into submitted/."""
    from nbgrader.apps import NbGraderAPI

    course_root = Path(course_root).resolve()
    if not (course_root / CONFIG_FILE).is_file():
        raise FileNotFoundError(f"{course_root} is not an nbgrader course root: it has no {CONFIG_FILE}")
    config = load_config(course_root / CONFIG_FILE)
    config.CourseDirectory.root = str(course_root)
    if "collect" not in config.ExchangeFactory:  # a course's own exchange keeps its own collect
        config.ExchangeFactory.collect = f"{__name__}.CollectWithoutFollowingLinks"
    api = NbGraderAPI(config=config)
    return "".join(_check(api.collect(a), f"collect {a}") for a in assignments)


class CollectWithoutFollowingLinks(ExchangeCollect):
    """nbgrader's collect, following no link a student put in the exchange's inbound folder (a submission that is
    a link, or a link inside one): nbgrader's copytree would read what it names (the instructor's solutions, as
    root) into submitted/. Otherwise nbgrader's ``do_copy``: its size limit, ignore rules and group modes."""

    accounts = Enum(["system", "pods"], default_value="system", config=True, help=(
        "Whose uid each inbound folder must have been made by: 'system', the named student's account on this "
        "machine where there is one (a class served by `autograder hub`); 'pods', the uid the student's pod runs as "
        "on Kubernetes (autograder.kubernetes.pod_uid), which no account of the instructor's pod names"))

    def _path_to_record(self, path):
        """nbgrader's record of an inbound folder; one whose name does not parse (anyone can make one) is kept as
        unreadable, for ``_forged`` to leave out, instead of failing the whole collect."""
        try:
            return super()._path_to_record(path)
        except Exception as err:  # nbgrader's self.fail, or the date parser's error
            return {"username": os.path.basename(path).split("+")[0], "filename": os.path.basename(path),
                    "timestamp": datetime.datetime(1970, 1, 1), "unreadable": f"its name does not parse ({err})"}

    def _sort_by_timestamp(self, records):
        """A student's genuine submissions, newest first as nbgrader has them; their forged ones only where they
        have no genuine one (``init_src`` then drops it). nbgrader picks from this list, by time or by the due date
        (``before_duedate``), so a forged folder is never the one picked over a genuine one: one stamped before the
        due date would otherwise be picked over the student's late submission, and dropped, and the student would
        have none."""
        genuine = [r for r in records if not self._forged(r)]
        return super()._sort_by_timestamp(genuine or records)

    def init_src(self):
        super().init_src()
        for record in [r for r in self.src_records if self._forged(r)]:
            self.log.warning("left out %s: %s", record["filename"], self._forged(record))
            self.src_records.remove(record)

    def _forged(self, record) -> str:
        """Why a folder in inbound is not the submission it is named as, or "": a folder another uid made in the
        name of a student whose uid is known (``accounts``; the exchange's inbound is writable by every student);
        and a time stamp from the future, which would outrank every later real submission."""
        if record.get("unreadable"):
            return record["unreadable"]
        path = os.path.join(self.inbound_path, record["filename"])
        try:
            owner, made_by = self._uid_of(record["username"]), os.lstat(path).st_uid
        except (KeyError, OSError):
            owner = made_by = None
        if owner is not None and made_by != owner:
            return f"made by uid {made_by}, not by {record['username']}"
        now = datetime.datetime.now(datetime.timezone.utc)
        stamp = record["timestamp"] if record["timestamp"].tzinfo else record["timestamp"].replace(
            tzinfo=datetime.timezone.utc)
        # a day's slack: nbgrader reads a stamp whose zone it does not know as UTC, hours off
        return f"time stamp {record['timestamp']} in the future" if stamp > now + datetime.timedelta(days=1) else ""

    def _uid_of(self, student: str) -> int:
        """The uid the student's own submissions are made by; KeyError where the machine has no account of theirs."""
        if self.accounts == "pods":
            from .kubernetes import pod_uid

            return pod_uid(student)
        return pwd.getpwnam(student).pw_uid

    def do_copy(self, src, dest, log=None):
        try:
            self._copy_without_links(src, dest)
        except (OSError, shutil.Error) as err:  # a file of the student's grading cannot read: theirs alone
            self.log.warning("left out %s: %s", src, str(err)[:300])
            shutil.rmtree(dest, ignore_errors=True)

    def _copy_without_links(self, src, dest):
        if os.path.islink(src) or not os.path.isdir(src):
            self.log.warning("left out %s: a link, or not a folder, which grading does not follow", src)
            return
        if self.get_size(src) > 1000 * self.coursedir.max_dir_size:
            raise RuntimeError(f"Directory size is too big. Size is {self.get_size(src)}, maximum size is "
                               f"{1000 * self.coursedir.max_dir_size}")
        rules = ignore_patterns(exclude=self.coursedir.ignore, include=self.coursedir.include,
                                max_file_size=self.coursedir.max_file_size, log=self.log)

        def ignored(folder, names):
            links = {n for n in names if os.path.islink(os.path.join(folder, n))}
            for name in sorted(links):
                self.log.warning("left out %s: a link, which grading does not follow", os.path.join(folder, name))
            return set(rules(folder, names)) | links

        # symlinks=True: a file made a link after the look above is copied as a link, never read through
        shutil.copytree(src, dest, symlinks=True, ignore=ignored)
        if self.coursedir.groupshared:
            for folder, _, files in os.walk(dest):
                for path in [folder, *(os.path.join(folder, f) for f in files)]:
                    if not os.path.islink(path):
                        wanted = 0o2770 if path == folder else 0o660
                        with contextlib.suppress(PermissionError):
                            os.chmod(path, os.stat(path).st_mode | wanted)


def feedback(output: Path, release: bool = False, db: str | None = None) -> list[str]:
    """Regenerate every graded student's feedback from the gradebook, copy it to OUT/feedback and, with
    ``release``, release it through the course's exchange. Returns the assignments done."""
    from .report import copy_feedback
    from .workspace import load_settings, nbgrader_api

    s = load_settings(output, db)
    graded = s.output / "course" / "autograded"
    done = [a for a in s.course.assignments if any(graded.glob(f"*/{a}/*.ipynb"))]
    for assignment in done:
        _check(nbgrader_api(s).generate_feedback(assignment, force=True), f"generate_feedback {assignment}")
        if release:
            with warnings.catch_warnings():  # nbgrader 0.9.6 passes its exchange a misspelt keyword ("authentictor")
                warnings.filterwarnings("ignore", "Passing unrecognized arguments", DeprecationWarning)
                _check(nbgrader_api(s, exchange=True).release_feedback(assignment), f"release_feedback {assignment}")
    copy_feedback(s.output, list(s.course.assignments))
    return done
