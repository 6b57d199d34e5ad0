"""A class served from this machine by JupyterHub: ``make hub`` (``python -m autograder hub``).

From a roster (CSV: ``username,role``, role ``student`` or ``instructor``), as root:

- one system account per user, its home readable by that user alone (0700): a student reads neither another's
  files nor the instructors';
- nbgrader's exchange (1777, as nbgrader's docs set it up for several users on one machine);
- the course root, owned by the first instructor and shared with the others through a group of their own,
  with the course's source, its assignments generated and released (students fetch them at once);
- a password for each user, drawn at random and written for the operator to hand out to
  ``STATE/private/initial-passwords.csv`` (root's alone): nobody can claim an account first (users change theirs at
  /hub/auth/change-password);
- JupyterHub on 127.0.0.1 (``hub/jupyterhub_config.py``) for the roster's users alone, each user's server run
  as that user's account (JupyterHub's LocalProcessSpawner), JupyterLab with nbgrader's Assignment List and
  Validate for everyone and formgrader, the course list and Create Assignment for instructors only.

Grading goes through this project's grader, from an instructor's terminal in JupyterLab, into the course's own
gradebook: ``python -m autograder collect --course ~/COURSE`` then ``python -m autograder grade
~/COURSE/submitted --course ~/COURSE --db sqlite:///$HOME/COURSE/gradebook.db --output ~/grading``
(docs/deploying.md). Hiding formgrader from students is convenience, not the boundary: a student who turns it on
in their own server sees their own files; the boundary is the accounts' permissions.
"""

from __future__ import annotations

import contextlib
import csv
import dbm
import grp
import json
import os
import pwd
import re
import secrets
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[1]
ROLES = ("student", "instructor")
# a name useradd accepts on every distribution (Debian's NAME_REGEX), and that JupyterHub keeps as it is
USERNAME = re.compile(r"^[a-z_][a-z0-9_-]{0,30}$")
COURSE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,30}$")
# accounts below this uid are the system's own (Debian's UID_MIN): the hub never takes one over
FIRST_USER_UID = 1000
# what students' servers leave out (JupyterLab's and Jupyter Server's own switches, per config folder)
INSTRUCTORS_ONLY_LAB = ("@jupyter/nbgrader:formgrader", "@jupyter/nbgrader:course-list",
                        "@jupyter/nbgrader:create-assignment")
INSTRUCTORS_ONLY_SERVER = ("nbgrader.server_extensions.formgrader", "nbgrader.server_extensions.course_list")


@dataclass(frozen=True)
class Member:
    name: str
    role: str


def read_roster(path: Path) -> list[Member]:
    """The roster's members; ValueError naming the line and what was expected, for anything else."""
    members, seen = [], set()
    with open(path, newline="") as f:
        for n, row in enumerate(csv.DictReader(f), start=2):
            name, role = (row.get("username") or "").strip(), (row.get("role") or "").strip().lower()
            if not USERNAME.match(name):
                raise ValueError(f"{path}, line {n}: username {name!r} is not a system account name (expected "
                                 "lower-case letters, digits, _ or -, starting with a letter or _, at most 31)")
            if role not in ROLES:
                raise ValueError(f"{path}, line {n}: role {role!r} for {name} (expected student or instructor)")
            if name in seen:
                raise ValueError(f"{path}, line {n}: {name} is on the roster twice")
            seen.add(name)
            members.append(Member(name, role))
    if not any(m.role == "instructor" for m in members):
        raise ValueError(f"{path}: no instructor (expected at least one row with role instructor)")
    return members


@dataclass(frozen=True)
class Class:
    members: list[Member]
    course_id: str
    exchange: Path
    state: Path  # the hub's own files: the proxy, each role's config folder, and private/ (database, secrets)

    @property
    def private(self) -> Path:
        """The hub's database, cookie secret and passwords: root's alone."""
        return self.state / "private"

    @property
    def instructors(self) -> list[str]:
        return [m.name for m in self.members if m.role == "instructor"]

    @property
    def course_root(self) -> Path:
        return Path(pwd.getpwnam(self.instructors[0]).pw_dir) / self.course_id

    @property
    def group(self) -> str:
        return f"{self.course_id}-instructors"[:32]


def ensure_account(name: str) -> None:
    """The user's system account, made if missing, its home for that user alone. An existing account of the
    system's own (a uid below FIRST_USER_UID: root, bin, sys, nobody...) is refused, never taken over."""
    try:
        found = pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "--create-home", "--user-group", "--shell", "/bin/bash", name], check=True)
        found = pwd.getpwnam(name)
    if found.pw_uid < FIRST_USER_UID:
        raise ValueError(f"{name} is one of the system's own accounts (uid {found.pw_uid}): expected a user's "
                         f"account (uid {FIRST_USER_UID} or more), or a name no account has yet")
    change_folder(Path(found.pw_dir), f"{name}'s home", (found.pw_uid,), mode=0o700)


def change_folder(folder: Path, what: str, made_by: tuple[int, ...], mode: int, uid: int = -1, gid: int = -1) -> None:
    """Root's change to a folder a user may control (a home, the exchange's course folder): opened without
    following a link, its owner checked and its mode and owner set through that descriptor, never by name again,
    so that nothing swapped in after the check can aim root's chmod or chown elsewhere. ValueError, saying what
    was expected, for a link, a file, or a folder another uid made."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as err:
        raise ValueError(f"{what} {folder} is not a folder (a link, a file or nothing: {err.strerror}): expected a "
                         "folder of its own; move that away and run again") from err
    try:
        owner = os.fstat(fd).st_uid
        if owner not in made_by:
            raise ValueError(f"{what} {folder} was made by someone else (uid {owner}): expected uid "
                             f"{' or '.join(map(str, made_by))}; move it away and run again")
        os.fchown(fd, uid, gid)
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def give_passwords(c: Class) -> Path:
    """A random password for each user who has none, stored as FirstUseAuthenticator stores one (bcrypt, in its
    dbm) and written for the operator alone to ``initial-passwords.csv``: the roster's names are known, so a
    password set by whoever logs in first would let anyone claim anyone's account."""
    import bcrypt

    given = c.private / "initial-passwords.csv"
    on_roster = {m.name for m in c.members}
    with dbm.open(str(c.private / "passwords.dbm"), "c", 0o600) as db:
        for gone in [key for key in db.keys() if key.decode() not in on_roster]:  # back on it: a new password
            del db[gone]
        new = {m.name: secrets.token_urlsafe(12) for m in c.members if m.name.encode() not in db}
        for name, password in new.items():
            db[name] = bcrypt.hashpw(password.encode(), bcrypt.gensalt())
    # the file lists the roster as it is now: those taken off it go, a line per user, whoever was added when
    handed_out = {name: password for name, password in _read_private_csv(given).items() if name in on_roster}
    _write_private(given, "".join(f"{name},{password}\n" for name, password in (handed_out | new).items()))
    return given


def _read_private_csv(path: Path) -> dict[str, str]:
    from .files import read_regular

    try:
        text = read_regular(path, 2**24).decode()
    except FileNotFoundError:
        return {}
    return dict(line.split(",", 1) for line in text.splitlines() if "," in line)


def _write_private(path: Path, text: str) -> None:
    """``text`` into ``path``, readable by its owner alone, whole or not at all (a new file renamed over it)."""
    partial = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(partial, path)


def role_config(role: str, course_id: str, exchange: str, course_root: str) -> dict[str, str]:
    """A role's Jupyter config folder, as {path inside it: text} (the spawner points JUPYTER_CONFIG_PATH at it):
    nbgrader's course id and exchange for everyone; students' servers without the instructors' extensions. One
    source for the hub on this machine and the one on Kubernetes (``autograder.kubernetes``)."""
    off = role == "student"
    return {
        "nbgrader_config.py": "c = get_config()  # noqa: F821\n"
        f"c.CourseDirectory.course_id = {course_id!r}\n"
        f"c.Exchange.root = {exchange!r}\n"
        # formgrader works in the course root, wherever the instructor's server starts
        + (f"c.CourseDirectory.root = {course_root!r}\n" if role == "instructor" else ""),
        "labconfig/page_config.json": json.dumps({"disabledExtensions": {name: off for name in INSTRUCTORS_ONLY_LAB}},
                                                 indent=1),
        "jupyter_server_config.json": json.dumps(
            {"ServerApp": {"jpserver_extensions": {name: not off for name in INSTRUCTORS_ONLY_SERVER}}}, indent=1),
    }


def write_role_config(c: Class) -> None:
    """Each role's config folder under STATE/config, readable by every user's server."""
    for role in ROLES:
        folder = c.state / "config" / role
        for name, text in role_config(role, c.course_id, str(c.exchange), str(c.course_root)).items():
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / name).write_text(text)
    config = c.state / "config"
    for path in [*config.rglob("*"), config]:  # every user's server reads its role's folder
        path.chmod(0o755 if path.is_dir() else 0o644)


def _check_reachable(name: str) -> None:
    """Each server runs this Python as its user (users_python.py made it one every account can reach): say so
    plainly where that user still cannot."""
    ran = subprocess.run(["runuser", "-u", name, "--", sys.executable, "-c", "import jupyterhub"],
                         capture_output=True, text=True)
    if ran.returncode:
        raise PermissionError(
            f"the users' servers run {sys.executable}, which {name} cannot run ({ran.stderr.strip()[-300:]}): "
            "put the checkout and the hub's state (--state) in folders every account can pass through")


def prepare_exchange(c: Class) -> None:
    """The exchange (1777), and in it the course's folder made now, the first instructor's, before any student
    could make it: with groupshared nbgrader no longer checks who owns it."""
    c.exchange.mkdir(parents=True, exist_ok=True)
    c.exchange.chmod(0o1777)
    course, owner = c.exchange / c.course_id, pwd.getpwnam(c.instructors[0])
    with contextlib.suppress(FileExistsError):
        course.mkdir()
    # a student may make entries in the exchange: what is there is checked and changed through one descriptor
    change_folder(course, "the exchange's course folder", (0, owner.pw_uid), mode=0o2775, uid=owner.pw_uid,
                  gid=grp.getgrnam(c.group).gr_gid)


def prepare_course_root(c: Class, source: Path, assignments: list[str]) -> None:
    """The course root in the first instructor's home, writable by every instructor (a group of theirs, set-gid
    folders), with the source copied in once and each assignment generated and released as the first instructor.

    Root makes the group and opens the owner's home to it; everything inside the course root is done as its owner,
    whose folder it is. Root never writes, chmods or chowns in a folder a user controls: there, a link swapped in
    between a check and a write would make root's write one anywhere on the machine."""
    try:
        grp.getgrnam(c.group)
    except KeyError:
        subprocess.run(["groupadd", c.group], check=True)
    # exactly the roster's instructors: one dropped from it, or now a student, loses the course root
    subprocess.run(["gpasswd", "--members", ",".join(c.instructors), c.group], check=True, capture_output=True)
    prepare_exchange(c)
    root, owner = c.course_root, pwd.getpwnam(c.instructors[0])
    # the other instructors pass through the owner's home to the course root, and see nothing else
    change_folder(root.parent, f"{owner.pw_name}'s home", (owner.pw_uid,), mode=0o710, gid=grp.getgrnam(c.group).gr_gid)
    if root.is_symlink() or (root.exists() and (not root.is_dir() or root.stat().st_uid != owner.pw_uid)):
        raise ValueError(f"{root} is not a folder of {owner.pw_name}'s: expected the course root, or nothing there "
                         "yet")

    def as_owner(*command: str, stdin: bytes | None = None) -> str:
        """``command`` run as the owner in the course root, which the owner makes where it is missing and enters
        (root does neither)."""
        enter = 'mkdir -p "$0" && cd "$0" && exec "$@"'
        done = subprocess.run(["runuser", "-u", owner.pw_name, "--", "sh", "-c", enter, str(root), *command],
                              input=stdin, capture_output=True, check=False)
        if done.returncode:
            said = (done.stdout + done.stderr).decode(errors="replace").strip()
            raise RuntimeError(f"{' '.join(command[:2])} as {owner.pw_name} in {root} failed: {said[-2000:]}")
        return done.stdout.decode(errors="replace")

    # root reads the source (the solutions are root's alone), the owner writes the copy: whole, or not at all
    packed = subprocess.run(["tar", "-C", str(source), "-cf", "-", "."], check=True, capture_output=True).stdout
    as_owner("sh", "-c", '[ -e source ] || { rm -rf .source.partial && mkdir .source.partial && '
             'tar -C .source.partial -xf - && mv .source.partial source; }', stdin=packed)
    as_owner("sh", "-c", "rm -f nbgrader_config.py && cat > nbgrader_config.py",
             stdin=course_config(c.course_id, str(root), str(c.exchange)).encode())
    for left in as_owner(sys.executable, "-I", "-c", GROUP_SHARED, c.group).splitlines():
        print(f"warning: the course root: {left}", file=sys.stderr)
    nbgrader = ["env", f"PATH={Path(sys.executable).parent}:{os.environ['PATH']}", f"HOME={root.parent}",
                sys.executable, "-m", "nbgrader"]
    for assignment in assignments:
        for step in ("generate_assignment", "release_assignment"):
            as_owner(*nbgrader, step, assignment, "--force", "--log-level=WARN")


# Run as the course root's owner, in it: the group and the modes every instructor needs (u+rwX,g+rwX,o-rwx and
# set-gid folders) on the owner's own files; another instructor's are theirs, and set-gid folders gave them the
# group. Each entry is opened without following a link (another instructor can rename entries in the group's
# folders) and changed through its descriptor; one that cannot be opened is named and left as it is.
GROUP_SHARED = """
import errno, grp, os, stat, sys

gid, me = grp.getgrnam(sys.argv[1]).gr_gid, os.getuid()


def share(name, dir_fd, shown):
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
    except OSError as err:
        if err.errno != errno.ELOOP:  # a link: nothing to change, and nothing followed
            print(f"left as it is: {shown}: {err.strerror}")
        return
    try:
        st = os.fstat(fd)
        folder = stat.S_ISDIR(st.st_mode)
        if st.st_uid != me or not (folder or stat.S_ISREG(st.st_mode)):
            return
        x = 0o110 if folder or st.st_mode & 0o111 else 0
        os.fchown(fd, -1, gid)
        os.fchmod(fd, (st.st_mode & 0o7770) | 0o660 | x | (stat.S_ISGID if folder else 0))
    finally:
        os.close(fd)


share(".", None, ".")
for folder, dirs, files, dir_fd in os.fwalk(".", follow_symlinks=False):
    for name in dirs + files:
        share(name, dir_fd, os.path.join(folder, name))
"""


def course_config(course_id: str, course_root: str, exchange: str, collect_accounts: str = "system") -> str:
    """The course root's nbgrader_config.py: this repository's (its checks, judged by the grader, and what its
    kernels preload), with the course root, its folders, the exchange and the instructors' sharing set on top;
    ``collect_accounts``: whose uids the collect checks inbound folders against (``exchange.py``)."""
    return ((CHECKOUT / "nbgrader_config.py").read_text() + "\n\n# the course served to the class (autograder/hub.py)\n"
            f"c.CourseDirectory.course_id = {course_id!r}\n"
            f"c.CourseDirectory.root = {course_root!r}\n"
            'c.CourseDirectory.source_directory = "source"\n'
            'c.CourseDirectory.release_directory = "release"\n'
            "c.CourseDirectory.groupshared = True  # what one instructor writes, the others can grade\n"
            f"c.Exchange.root = {exchange!r}\n"
            f"c.CollectWithoutFollowingLinks.accounts = {collect_accounts!r}\n")


def hide_from_students() -> None:
    """What of the checkout no student may read: the instructor's solutions, the history that holds them, the
    sample class (whose ada answers everything) and any grading run's folder. The rest stays readable: every
    user's server imports this checkout's packages (the checks' references with them, as in any student's own
    session: grading is where they are out of reach)."""
    for private in (CHECKOUT / "solutions", CHECKOUT / ".git", CHECKOUT / "autograder" / "sample_class",
                    CHECKOUT / "grading", CHECKOUT / "gradebook.db"):
        if private.exists() and not private.is_symlink():
            subprocess.run(["chmod", "-R", "o-rwx", str(private)], check=True)


def check_course_id(course_id: str) -> None:
    """A ValueError for a course id that is not one, saying what is expected: it names a folder and a group here,
    and a Job on Kubernetes."""
    if not COURSE_ID.match(course_id):
        raise ValueError(f"course id {course_id!r}: expected letters, digits, _ or -, at most 31")


def require_root() -> None:
    if os.geteuid() != 0:
        raise PermissionError("the hub runs each user's server as that user's own system account, which only root "
                              "can create and switch to: run `make hub` as root (or with sudo)")


def read_class(roster: Path, course_id: str) -> list[Member]:
    """The class's members, or the error that says what is wrong with the roster or the course id (or that this
    is not root), before anything is made for it."""
    require_root()
    check_course_id(course_id)
    members = read_roster(roster)
    if any(m.name == f"{course_id}-instructors"[:32] for m in members):
        raise ValueError(f"{course_id}-instructors is the instructors' group: no user may have that name")
    return members


def set_up(roster: Path, state: Path, course_id: str, source: Path, exchange: Path) -> Class:
    members = read_class(roster, course_id)
    assignments = sorted(p.name for p in source.iterdir() if p.is_dir() and any(p.glob("*.ipynb")))
    if not assignments:
        raise FileNotFoundError(f"no assignments in {source}: expected one folder of notebooks per assignment")
    c = Class(members, course_id, exchange.resolve(), state.resolve())
    for m in members:
        ensure_account(m.name)
    _check_reachable(members[0].name)
    c.private.mkdir(parents=True, exist_ok=True)
    c.state.chmod(0o711)  # the users' servers pass through to their role's config, and list nothing
    c.private.chmod(0o700)
    write_role_config(c)
    give_passwords(c)
    hide_from_students()
    prepare_course_root(c, source, assignments)
    (c.private / "roster.json").write_text(json.dumps(
        {"members": [m.__dict__ for m in members], "course_id": course_id, "python": sys.executable}))
    return c


def start(c: Class, port: int) -> subprocess.Popen:
    """JupyterHub for the class, on 127.0.0.1:``port`` (hub/jupyterhub_config.py reads the class from its state)."""
    proxy = c.state / "node_modules" / ".bin" / "configurable-http-proxy"
    if not proxy.exists():
        raise FileNotFoundError(f"JupyterHub's proxy is not installed at {proxy}: `make hub` installs it with npm "
                                "(npm install --prefix .hub configurable-http-proxy)")
    env = {**os.environ, "ALIBI_HUB_STATE": str(c.state), "ALIBI_HUB_PORT": str(port),
           "PATH": f"{Path(sys.executable).parent}:{proxy.parent}:{os.environ['PATH']}"}
    return subprocess.Popen([sys.executable, "-m", "jupyterhub", "-f", str(CHECKOUT / "hub" / "jupyterhub_config.py")],
                            cwd=c.state, env=env)
