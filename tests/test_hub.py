"""The class served by JupyterHub (autograder/hub.py): the roster read strictly, then a real hub on 127.0.0.1
with real system accounts, where the machine allows them."""

import contextlib
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from autograder.hub import read_roster

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("rows, says", [
    ("username,role\nAda,student\nteach,instructor\n", "username 'Ada' is not a system account name"),
    ("username,role\nada,learner\nteach,instructor\n", "role 'learner' for ada (expected student or instructor)"),
    ("username,role\nada,student\nada,student\nteach,instructor\n", "line 3: ada is on the roster twice"),
    ("username,role\nada,student\n", "no instructor"),
    ("name,kind\nada,student\n", "username '' is not a system account name"),
])
def test_a_roster_that_is_not_one_says_what_was_expected(tmp_path, rows, says):
    (tmp_path / "roster.csv").write_text(rows)
    with pytest.raises(ValueError, match=re.escape(says)):
        read_roster(tmp_path / "roster.csv")


def test_a_roster_reads_each_member_and_role(tmp_path):
    (tmp_path / "roster.csv").write_text("username,role\nteach,Instructor\nada,student\n bob , student\n")
    assert [(m.name, m.role) for m in read_roster(tmp_path / "roster.csv")] == [
        ("teach", "instructor"), ("ada", "student"), ("bob", "student")]


def _why_no_hub() -> str | None:
    if os.geteuid() != 0 or not shutil.which("useradd"):
        return "the hub makes system accounts: root with useradd only"
    if not shutil.which("npm"):
        return "JupyterHub's proxy comes from npm, which is not here"
    probe = subprocess.run(["runuser", "-u", "nobody", "--", sys.executable, "-c", "import jupyterhub"],
                           capture_output=True, text=True)
    if probe.returncode:
        return (f"the users' servers run {sys.executable}, which an unprivileged account cannot run here "
                f"({probe.stderr.strip()[-120:]})")
    return None


def _three_free_ports() -> int:
    """The first of three free ports in a row on 127.0.0.1: the hub's, its own API's, its proxy's."""
    for first in range(8230, 8330, 3):
        with contextlib.ExitStack() as held:
            try:
                for port in range(first, first + 3):
                    held.enter_context(socket.create_server(("127.0.0.1", port)))
            except OSError:
                continue
            return first
    raise AssertionError("no three free ports in a row from 8230 on")


@pytest.mark.skipif(_why_no_hub() is not None, reason=str(_why_no_hub()))
def test_each_user_gets_a_server_of_their_own_account_and_students_no_formgrader():
    import requests

    # in /tmp itself: the users' servers and the first instructor read the hub's folders, which pytest's own
    # (root-only) temporary folders would hide from them
    tmp_path = Path(tempfile.mkdtemp(prefix="alibi-hub-"))
    tmp_path.chmod(0o755)
    state, port = tmp_path / "state", _three_free_ports()
    state.mkdir()
    subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--silent", "--prefix", str(state),
                    "configurable-http-proxy@5.3.0"], check=True, capture_output=True)
    roster = tmp_path / "roster.csv"
    roster.write_text("username,role\nhubtest-teach,instructor\nhubtest-ann,student\nhubtest-ben,student\n")
    source = tmp_path / "source" / "hw1"
    source.mkdir(parents=True)
    shutil.copy(ROOT / "solutions" / "alibi" / "03_slope_zero.ipynb", source)
    hub = subprocess.Popen([sys.executable, "-m", "autograder", "hub", "--roster", str(roster), "--state", str(state),
                            "--course-id", "hubtest", "--source", str(source.parent), "--exchange",
                            str(tmp_path / "exchange"), "--port", str(port)], cwd=ROOT, start_new_session=True,
                           stdout=open(tmp_path / "hub.log", "wb"), stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        def log_in(user: str, password: str, tries: int = 90) -> requests.Session:
            s = requests.Session()
            for _ in range(120):  # the hub first sets the class up, then its proxy answers before it does
                try:
                    page = s.get(f"{base}/hub/login", timeout=5)
                    if page.status_code == 200:
                        break
                except requests.RequestException:  # not listening yet, or the proxy waiting for the hub
                    pass
                assert hub.poll() is None, f"the hub stopped: {(tmp_path / 'hub.log').read_text()[-3000:]}"
                time.sleep(1)
            xsrf = s.cookies.get("_xsrf") or re.search(r'name="_xsrf" value="([^"]+)"', page.text).group(1)
            s.post(f"{base}/hub/login?next=", data={"username": user, "password": password, "_xsrf": xsrf}, timeout=180)
            for _ in range(tries):  # the server starting, as the user: then its nbgrader API answers
                listed = s.get(f"{base}/user/{user}/assignments?course_id=hubtest", timeout=60)
                if listed.status_code == 200 and listed.url.startswith(f"{base}/user/{user}/"):
                    return s
                time.sleep(1)
            raise AssertionError(f"{user}'s server did not start: {listed.status_code} {listed.url}\n"
                                 f"{(tmp_path / 'hub.log').read_text()[-3000:]}")

        with pytest.raises(AssertionError, match="did not start"):  # nobody claims an account by logging in first
            log_in("hubtest-teach", "a-password-of-ones-own", tries=3)
        given = dict(line.split(",") for line in (state / "private" / "initial-passwords.csv").read_text().split())
        assert oct((state / "private").stat().st_mode & 0o777) == "0o700"
        ann, teach = log_in("hubtest-ann", given["hubtest-ann"]), log_in("hubtest-teach", given["hubtest-teach"])
        for user in ("hubtest-ann", "hubtest-teach"):  # each server is its user's own process
            running = subprocess.run(["ps", "-ww", "-u", user, "-o", "args="], capture_output=True, text=True).stdout
            assert "jupyterhub-singleuser" in running, (user, running)
        # the released assignment in the student's Assignment List; formgrader for the instructor alone
        listed = ann.get(f"{base}/user/hubtest-ann/assignments?course_id=hubtest", timeout=60).json()
        assert [a["assignment_id"] for a in listed["value"]] == ["hw1"], listed
        assert ann.get(f"{base}/user/hubtest-ann/formgrader", timeout=30).status_code == 404
        assert teach.get(f"{base}/user/hubtest-teach/formgrader", timeout=30).status_code == 200
        managed = teach.get(f"{base}/user/hubtest-teach/formgrader/api/assignments", timeout=60)
        assert [a["name"] for a in managed.json()] == ["hw1"], managed.text[:500]  # formgrader is in the course
        # another's server, another's home, the course root, the solutions, the hub's secrets: refused
        assert ann.get(f"{base}/user/hubtest-ben/lab", timeout=30).status_code in (403, 404)
        for folder in ("/home/hubtest-ben", "/home/hubtest-teach/hubtest", str(ROOT / "solutions"), str(ROOT / ".git"),
                       str(ROOT / "autograder" / "sample_class"), str(state / "private")):
            assert subprocess.run(["runuser", "-u", "hubtest-ann", "--", "ls", folder],
                                  capture_output=True).returncode != 0, folder
        # a submission one student makes in another's name: the exchange's inbound is every student's to write
        stamp = time.strftime("%Y-%m-%d %H:%M:%S.000000 UTC", time.gmtime())
        forged = tmp_path / "exchange" / "hubtest" / "inbound" / f"hubtest-ben+hw1+{stamp}+forged"
        subprocess.run(["runuser", "-u", "hubtest-ann", "--", "mkdir", str(forged)], check=True)
        subprocess.run(["runuser", "-u", "hubtest-ann", "--", "sh", "-c",
                        f"echo '{{\"cells\": [], \"metadata\": {{}}, \"nbformat\": 4, \"nbformat_minor\": 5}}' "
                        f"> '{forged}/03_slope_zero.ipynb'"], check=True)
        course = Path("/home/hubtest-teach/hubtest")
        collected = subprocess.run(["runuser", "-u", "hubtest-teach", "--", "env", "HOME=/home/hubtest-teach",
                                    f"PATH={Path(sys.executable).parent}:/usr/bin:/bin", sys.executable, "-m",
                                    "autograder", "collect", "--course", str(course)],
                                   cwd="/tmp", capture_output=True, text=True)
        assert collected.returncode == 0, collected.stderr[-2000:]
        assert not (course / "submitted" / "hubtest-ben").exists(), "a submission made in another's name was collected"
    finally:
        os.killpg(hub.pid, 15)
        try:
            hub.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(hub.pid, 9)
        for user in ("hubtest-teach", "hubtest-ann", "hubtest-ben"):
            subprocess.run(["pkill", "-KILL", "-u", user], capture_output=True)
        time.sleep(1)  # userdel refuses an account whose processes are still there
        for user in ("hubtest-teach", "hubtest-ann", "hubtest-ben"):
            subprocess.run(["userdel", "--remove", user], capture_output=True)
        subprocess.run(["groupdel", "hubtest-instructors"], capture_output=True)
        shutil.rmtree(tmp_path, ignore_errors=True)
