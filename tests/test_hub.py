"""The class served by JupyterHub (autograder/hub.py): the roster read strictly, then a class taking an assignment
through a real hub on 127.0.0.1, with real system accounts, in chromium, where the machine allows them."""

import contextlib
import json
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
from autograder.users_python import passable_by_all

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


@pytest.mark.skipif(os.geteuid() != 0, reason="changing who owns a folder needs root")
def test_a_link_or_a_strangers_folder_where_the_exchange_course_goes_is_refused_untouched(tmp_path, monkeypatch):
    """The exchange is writable by every student: what one put where the course's folder goes is refused, and
    root's chown and chmod never reach what a link there names."""
    from autograder.hub import Class, Member, prepare_exchange

    monkeypatch.setattr(Class, "group", property(lambda c: "root"))  # one that exists: set-up makes the course's
    c = Class([Member("nobody", "instructor")], "alibi", tmp_path / "exchange", tmp_path / "state")
    c.exchange.mkdir()
    named = tmp_path / "roots-own"
    named.mkdir(mode=0o700)
    (c.exchange / "alibi").symlink_to(named)
    with pytest.raises(ValueError, match="is not a folder"):
        prepare_exchange(c)
    assert (named.stat().st_uid, named.stat().st_mode & 0o7777) == (0, 0o700)
    (c.exchange / "alibi").unlink()
    (c.exchange / "alibi").mkdir()
    os.chown(c.exchange / "alibi", 12345, 12345)
    with pytest.raises(ValueError, match=r"made by someone else \(uid 12345\)"):
        prepare_exchange(c)


def test_the_passwords_file_lists_the_roster_as_it_is_now(tmp_path):
    """Each run gives a password to each member who has none, keeps those handed out to members still on the
    roster, and drops those of members taken off it; the file is the owner's alone."""
    from autograder.hub import Class, Member, give_passwords

    def run(*names):
        c = Class([Member(n, "student") for n in names], "alibi", tmp_path / "exchange", tmp_path / "state")
        c.private.mkdir(parents=True, exist_ok=True)
        given = give_passwords(c)
        assert given.stat().st_mode & 0o777 == 0o600
        return dict(line.split(",") for line in given.read_text().splitlines())

    first = run("ann", "bob")
    assert sorted(first) == ["ann", "bob"] and first["ann"] != first["bob"]
    second = run("bob", "cat")  # ann left, cat joined
    assert sorted(second) == ["bob", "cat"] and second["bob"] == first["bob"]
    assert run("bob", "cat") == second  # nothing changed, nothing new
    back = run("ann", "bob", "cat")  # ann's old password went with her: back, she gets a new one
    assert back["ann"] != first["ann"] and {n: back[n] for n in second} == second
    assert [p.name for p in (tmp_path / "state" / "private").iterdir() if p.name.startswith(".")] == []


def _why_no_hub() -> str | None:
    if os.geteuid() != 0 or not shutil.which("useradd"):
        return "the hub makes system accounts: root with useradd only"
    if not shutil.which("npm"):
        return "JupyterHub's proxy comes from npm, which is not here"
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


def _why_no_browser() -> str | None:
    from test_browser import CHROMIUM, sync_playwright

    if sync_playwright is None:
        return "Playwright is not installed (it is in requirements.txt)"
    return None if os.path.exists(CHROMIUM) else "no chromium: `apt-get install chromium` (make test does)"


RIGHT = "def squares(n):\n    return [i * i for i in range(n)]\n"
WRONG = "def squares(n):\n    return [i * i for i in range(1, n + 1)]\n"  # from 1: the visible test catches it


@pytest.mark.browser
@pytest.mark.skipif(_why_no_hub() is not None, reason=str(_why_no_hub()))
@pytest.mark.skipif(_why_no_browser() is not None, reason=str(_why_no_browser()))
def test_a_class_takes_an_assignment_through_the_hub_in_a_browser():
    """Two students and an instructor log in to the hub in chromium. The students fetch the assignment, answer it
    (one right, one wrong), validate and submit; the instructor collects and grades with this project's grader,
    grades the written answer by hand in formgrader and releases the feedback; each student fetches theirs and
    sees their own points, the hand-given one with them, and no hidden test. A student reaches neither another's
    server nor formgrader, nor, as their account, another's files. Screenshots: browser-screenshots/hub-*.png."""
    import requests
    from test_browser import CHROMIUM, CHROMIUM_ARGS, SHOTS, expect, sync_playwright
    from tiny_course import _source_notebooks

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
    import nbformat

    nbformat.write(_source_notebooks()["hw1"]["squares"], source / "squares.ipynb")
    hub = subprocess.Popen([sys.executable, "-m", "autograder", "hub", "--roster", str(roster), "--state", str(state),
                            "--course-id", "hubtest", "--source", str(source.parent), "--exchange",
                            str(tmp_path / "exchange"), "--port", str(port)], cwd=ROOT, start_new_session=True,
                           stdout=open(tmp_path / "hub.log", "wb"), stderr=subprocess.STDOUT)
    base, course = f"http://127.0.0.1:{port}", Path("/home/hubtest-teach/hubtest")
    SHOTS.mkdir(exist_ok=True)

    def hub_log() -> str:
        return (tmp_path / "hub.log").read_text()[-3000:]

    def as_user(user: str, *command: str) -> subprocess.CompletedProcess:
        """As the user's own terminal runs it: their environment, none of root's (this session's caches)."""
        return subprocess.run(["runuser", "-u", user, "--", "env", "-i", f"HOME=/home/{user}", f"USER={user}",
                               "LANG=C.UTF-8", f"PATH={python.parent}:/usr/bin:/bin", *command],
                              cwd="/tmp", capture_output=True, text=True)

    try:
        for _ in range(180):  # the hub first sets the class up, then its proxy answers before it does
            with contextlib.suppress(requests.RequestException):
                if requests.get(f"{base}/hub/login", timeout=5).status_code == 200:
                    break
            assert hub.poll() is None, f"the hub stopped: {hub_log()}"
            time.sleep(1)
        given = dict(line.split(",") for line in (state / "private" / "initial-passwords.csv").read_text().split())
        # the Python the servers run: this one, or where its base is root's alone (pyenv's), the hub's copy of it
        python = Path(json.loads((state / "private" / "roster.json").read_text())["python"])
        assert (python == Path(sys.executable)) == passable_by_all(Path(sys.base_prefix) / "bin"), python
        if python != Path(sys.executable):  # the copy: Python's own files alone, root's to change
            copied = [p for p in (state / "python").rglob("*") if not p.is_symlink()]
            assert sorted(p.name for p in (state / "python").iterdir()) == [".copy-of", "bin", "include", "lib"]
            assert not any((state / "python").glob("lib/python*/site-packages/*")), "the base's packages copied"
            assert [p for p in copied if p.stat().st_uid != 0 or p.stat().st_mode & 0o022] == []
        assert oct((state / "private").stat().st_mode & 0o777) == "0o700"
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)

            def log_in(user: str, password: str):
                page = browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()
                page.set_default_timeout(120_000)
                page.goto(f"{base}/hub/login")
                page.fill("#username_input", user)
                page.fill("#password_input", password)
                page.click("#login_submit")
                return page

            # nobody claims an account by logging in first with a password of their own
            intruder = log_in("hubtest-teach", "a-password-of-ones-own")
            expect(intruder.locator(".login_error, #login_error_message, p.login_error")).to_contain_text("Invalid")
            intruder.screenshot(path=str(SHOTS / "hub-0-wrong-password.png"))
            intruder.context.close()

            def open_lab(user: str):
                page = log_in(user, given[user])
                page.wait_for_url(f"{base}/user/{user}/lab**", timeout=180_000)
                page.locator("#jp-main-dock-panel").wait_for()
                return page

            def assignments(page):
                page.keyboard.press("Control+Shift+c")
                page.locator('#modal-command-palette li[data-command="nbgrader:open-assignment-list"]').click()
                page.locator("#released_assignments_list").wait_for()

            def rows(page, kind: str, count: int):
                listed = page.locator(f"#{kind}_assignments_list > .list_item")
                expect(listed).to_have_count(count)
                return listed

            def save_notebook(page, user: str):
                """Saved, as a student saves: the toolbar's Save, again until the tab is clean. JupyterLab's autosave
                or a slow server can come first: a dialog asking to overwrite is answered yes."""
                dirty = page.locator(".lm-TabBar-tab.jp-mod-dirty")
                for attempt in range(12):
                    dialog = page.locator(".jp-Dialog")
                    if dialog.count():
                        page.screenshot(path=str(SHOTS / f"hub-3-{user}-save-dialog-{attempt}.png"))
                        dialog.locator(".jp-mod-accept").first.click()
                    elif dirty.count():
                        page.locator('.jp-NotebookPanel-toolbar [data-command="docmanager:save"]').first.click()
                    with contextlib.suppress(AssertionError):
                        expect(dirty).to_have_count(0, timeout=5_000)
                        return
                page.screenshot(path=str(SHOTS / f"hub-3-{user}-not-saved.png"))
                expect(dirty).to_have_count(0)

            def answer_and_submit(user: str, code: str, written: str, passes: bool):
                page = open_lab(user)
                page.screenshot(path=str(SHOTS / f"hub-1-{user}-logged-in.png"))
                assignments(page)
                rows(page, "released", 1).first.locator(".item_status button").click()  # Fetch
                rows(page, "fetched", 1)
                page.screenshot(path=str(SHOTS / f"hub-2-{user}-fetched.png"))
                page.locator('#fetched_assignments_list a:text("hw1")').click()
                page.locator('#fetched_assignments_list a:text("squares")').click()
                cell = page.locator(".jp-CodeCell").filter(has=page.locator(".cm-content", has_text="def squares"))
                cell.locator(".cm-content").click()
                page.keyboard.press("Control+a")
                page.keyboard.insert_text(code)
                written_cell = page.locator(".jp-MarkdownCell").filter(has_text="YOUR ANSWER HERE")
                written_cell.dblclick()  # a rendered Markdown cell opens its editor on a double click
                written_cell.locator(".cm-content").click()
                page.keyboard.press("Control+a")
                page.keyboard.insert_text(written)
                page.keyboard.press("Shift+Enter")
                save_notebook(page, user)
                page.get_by_role("button", name="Validate").first.click()
                dialog = page.locator(".jp-Dialog")
                expect(dialog).not_to_contain_text("Validating", timeout=120_000)
                expect(dialog).to_contain_text(re.compile("Success" if passes else "failed", re.IGNORECASE))
                page.screenshot(path=str(SHOTS / f"hub-3-{user}-validated.png"))
                dialog.get_by_role("button").last.click()
                page.locator(".lm-TabBar-tab", has_text="Assignments").click()
                rows(page, "fetched", 1).first.locator('.item_status button:text("Submit")').click()
                rows(page, "submitted", 1)
                page.screenshot(path=str(SHOTS / f"hub-4-{user}-submitted.png"))
                return page

            ann = answer_and_submit("hubtest-ann", RIGHT, "range(0) has no numbers.", passes=True)
            ben = answer_and_submit("hubtest-ben", WRONG, "It just does.", passes=False)
            for user in ("hubtest-ann", "hubtest-ben"):  # each server is its user's own process
                running = subprocess.run(["ps", "-ww", "-u", user, "-o", "args="], capture_output=True, text=True)
                assert "jupyterhub-singleuser" in running.stdout, (user, running.stdout)

            # a submission one student makes in another's name: the exchange's inbound is every student's to write
            stamp = time.strftime("%Y-%m-%d %H:%M:%S.000000 UTC", time.gmtime())
            forged = tmp_path / "exchange" / "hubtest" / "inbound" / f"hubtest-ben+hw1+{stamp}+forged"
            assert as_user("hubtest-ann", "mkdir", str(forged)).returncode == 0
            assert as_user("hubtest-ann", "cp", "/home/hubtest-ann/hw1/squares.ipynb", str(forged)).returncode == 0

            # the instructor collects and grades with this project's grader, from the course root, as themselves
            teach = open_lab("hubtest-teach")
            db = f"sqlite:///{course / 'gradebook.db'}"
            for step in (["collect", "--course", str(course)],
                         ["grade", str(course / "submitted"), "--course", str(course), "--db", db, "--output",
                          "/home/hubtest-teach/grading", "--no-progress", "--for-formgrader"]):
                done = as_user("hubtest-teach", str(python), "-m", "autograder", *step)
                assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
            autograded = sorted(str(p.relative_to(course)) for p in (course / "autograded").rglob("*.ipynb"))
            assert autograded == [f"autograded/{u}/hw1/squares.ipynb" for u in ("hubtest-ann", "hubtest-ben")], (
                autograded, done.stdout[-2000:], done.stderr[-2000:])
            submitted = sorted(p.name for p in (course / "submitted").iterdir())
            assert submitted == ["hubtest-ann", "hubtest-ben"]  # the forged folder is left out
            forged_collected = (course / "submitted" / "hubtest-ben" / "hw1" / "squares.ipynb").read_text()
            assert "range(1, n + 1)" in forged_collected, "ben's own submission lost to the one made in his name"

            # the written answers graded by hand in formgrader
            listed = teach.request.get(f"{base}/user/hubtest-teach/formgrader/api/submitted_notebooks/hw1/squares")
            assert listed.ok, listed.text()[:500]
            ids = {s["student"]: s["id"] for s in listed.json()}
            assert sorted(ids) == ["hubtest-ann", "hubtest-ben"], listed.text()[:1000]
            for user, points, total in (("hubtest-ann", "1", 3.0), ("hubtest-ben", "0.5", 0.5)):
                teach.goto(f"{base}/user/hubtest-teach/formgrader/submissions/{ids[user]}/")
                # formgrader binds each score's input once its request for the grades comes back, after the page's
                # load: a score typed before then is not saved
                teach.wait_for_function("() => window.formgrader && formgrader.grades && formgrader.grades.loaded")
                score = teach.locator("input#why_empty")
                score.fill(points)
                score.press("Tab")  # formgrader saves a score as it changes
                for _ in range(30):
                    scores = {s["student"]: s["score"] for s in teach.request.get(listed.url).json()}
                    if scores[user] == total:
                        break
                    time.sleep(1)
                teach.screenshot(path=str(SHOTS / f"hub-5-teach-grades-{user}.png"))
                assert scores[user] == total, (scores, hub_log())  # the servers' log, formgrader's requests in it
            done = as_user("hubtest-teach", str(python), "-m", "autograder", "feedback", "--output",
                           "/home/hubtest-teach/grading", "--db", db, "--release")
            assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]

            # each student fetches their feedback and reads it in their own server: the hand-given point with the
            # autograded ones, and no hidden test
            for page, user, total in ((ann, "hubtest-ann", "3.0 / 3.0"), (ben, "hubtest-ben", "0.5 / 3.0")):
                page.locator("#refresh_assignments_list").click()
                rows(page, "submitted", 1).first.locator('.item_status button:text("Fetch Feedback")').click()
                expect(page.locator("#submitted_assignments_list")).to_contain_text("view feedback")
                feedback = next(Path(f"/home/{user}/hw1/feedback").glob("*/squares.html"))
                page.goto(f"{base}/user/{user}/files/hw1/feedback/{feedback.parent.name}/squares.html")
                expect(page.locator("body")).to_contain_text(total)
                assert "squares(6)" not in page.content()
                page.screenshot(path=str(SHOTS / f"hub-6-{user}-feedback.png"))

            # what a student cannot reach: another's server, formgrader, another's feedback
            for url in (f"{base}/user/hubtest-ben/lab", f"{base}/user/hubtest-ann/formgrader",
                        f"{base}/user/hubtest-ben/files/hw1/squares.ipynb"):
                assert ann.goto(url).status in (403, 404), url
            ann.screenshot(path=str(SHOTS / "hub-7-ann-refused.png"))
            browser.close()
        # as their account: another's home, the course root, the solutions, the hub's secrets
        for folder in ("/home/hubtest-ben", str(course), str(ROOT / "solutions"), str(ROOT / ".git"),
                       str(ROOT / "autograder" / "sample_class"), str(state / "private")):
            assert as_user("hubtest-ann", "ls", folder).returncode != 0, folder
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
