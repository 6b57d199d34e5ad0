"""Students and instructors in a real browser: JupyterLab with nbgrader, driven in Debian's chromium.

Screenshots of every step land in browser-screenshots/ at the repository root, for a person to
look at. Where chromium or Playwright is missing the tests are skipped and say why.
"""

import contextlib
import csv
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import prepared_like

ROOT = Path(__file__).resolve().parents[1]
SHOTS = ROOT / "browser-screenshots"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
TOKEN = "alibi-course-test"

try:
    from playwright.sync_api import expect, sync_playwright
except ImportError:  # pragma: no cover - the pinned requirements install it
    sync_playwright = None

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(sync_playwright is None, reason="Playwright is not installed (it is in requirements.txt)"),
    pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="no chromium: `apt-get install chromium` (make test does)"),
]
# flags for a headless chromium on a machine with no network and no GPU
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-sync",
                 "--disable-background-networking", "--disable-component-update"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def jupyterlab(root: Path):
    """A JupyterLab server on 127.0.0.1 serving ``root``; yields its base URL."""
    port = _free_port()
    settings = root / ".jupyterlab-settings"
    # no autosave: one landing while the test's own save is in flight makes JupyterLab ask whether to overwrite
    # a file "changed on disk" (a race a loaded machine wins), and the dialog then stands where Validate's would
    autosave = settings / "@jupyterlab" / "docmanager-extension" / "plugin.jupyterlab-settings"
    autosave.parent.mkdir(parents=True, exist_ok=True)
    autosave.write_text('{"autosave": false}')
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "JUPYTER_CONFIG_DIR": str(root / ".jupyter-config"), "JUPYTERLAB_SETTINGS_DIR": str(settings)}
    log = open(root / "jupyterlab.log", "w")  # closed in the finally below
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
         f"--ServerApp.token={TOKEN}", f"--ServerApp.root_dir={root}", "--ServerApp.allow_root=True",
         "--LabApp.news_url=None"],
        cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{url}/api/status?token={TOKEN}", timeout=2)
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise RuntimeError(
                        f"JupyterLab did not start:\n{(root / 'jupyterlab.log').read_text()[-3000:]}") from None
                time.sleep(0.3)
        yield url
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()


@pytest.fixture
def browser_page():
    SHOTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.set_default_timeout(90_000)
        yield page
        browser.close()


def shot(page, name: str) -> None:
    page.screenshot(path=str(SHOTS / f"{name}.png"))


def _dismiss_popups(page) -> None:
    no = page.get_by_role("button", name="No", exact=True)
    if no.count():
        no.first.click()


def test_student_runs_answers_and_validates_a_notebook(tmp_path, browser_page, graded_sample_class):
    """A student answers two exercises (one right, one with a classic mistake), sees the checks' verdicts,
    validates, and grading the saved notebook gives the same verdicts."""
    page = browser_page
    shutil.copytree(ROOT / "course", tmp_path / "course")
    with jupyterlab(tmp_path / "course") as url:
        page.goto(f"{url}/lab/tree/alibi/01_slopes_and_bias.ipynb?token={TOKEN}")
        page.locator(".jp-Notebook").wait_for()
        expect(page.locator(".jp-Notebook-ExecutionIndicator, #jp-main-statusbar").first).to_be_visible()
        page.get_by_text("Python 3 (ipykernel) | Idle").wait_for()
        _dismiss_popups(page)
        shot(page, "student-1-opened")

        # run every cell: the explorer renders before the first exercise stops the run
        page.get_by_role("menuitem", name="Run", exact=True).click()
        page.get_by_role("menuitem", name="Run All Cells", exact=True).click()
        explorer = page.locator(".alibi-explorer").first  # the controls; the figure is the cell's image output
        explorer.wait_for()
        figure = page.locator(".jp-CodeCell").filter(has=explorer).locator(".jp-RenderedImage img")
        image = figure.first
        image.wait_for()
        explorer.scroll_into_view_if_needed()
        shot(page, "student-2-ran-all-explorer")
        first_plot = image.get_attribute("src")
        assert first_plot.startswith("data:image/png")

        # the widget reacts: move the "head" slider one step and the heatmap is redrawn
        head = explorer.locator(".widget-slider").filter(has=page.locator("label", has_text=re.compile(r"^head$")))
        head.locator(".noUi-handle").focus()
        page.keyboard.press("ArrowRight")
        expect(head.locator(".widget-readout")).to_have_text("2")
        expect(figure.first).not_to_have_attribute("src", first_plot, timeout=30_000)  # a loaded machine redraws slowly
        shot(page, "student-3-slider-moved")

        # the slope follows the head; dragged to 0 (Home), the heatmap goes flat and the bars uniform
        slope = explorer.locator(".widget-slider").filter(has=page.locator("label", has_text=re.compile(r"^slope$")))
        expect(slope.locator(".widget-readout")).to_have_text("0.2500")
        second_plot = figure.first.get_attribute("src")
        slope.locator(".noUi-handle").focus()
        page.keyboard.press("Home")
        expect(slope.locator(".widget-readout")).to_have_text("0.0000")
        expect(figure.first).not_to_have_attribute("src", second_plot, timeout=30_000)
        expect(figure).to_have_count(1)  # replaced in place, never a second figure
        shot(page, "student-3b-slope-zero")

        # the first exercise's test stopped "Run All" with the stub's error, as it should
        def code_cell(source_text):
            return page.locator(".jp-CodeCell").filter(has=page.locator(".cm-content", has_text=source_text))

        answer = code_cell("def paper_slopes")
        test_cell = code_cell('check("paper_slopes", paper_slopes)')
        expect(test_cell.locator(".jp-OutputArea")).to_contain_text("NotImplementedError")

        # type a correct answer, run it and its test cell
        answer.locator(".cm-content").click()
        page.keyboard.press("Control+a")
        page.keyboard.insert_text(
            "def paper_slopes(n_heads, max_bias=8.0):\n"
            "    def geometric(n):\n"
            "        return 2.0 ** (-max_bias * np.arange(1, n + 1) / n)\n"
            "    p = 2 ** int(np.floor(np.log2(n_heads)))\n"
            "    if p == n_heads:\n"
            "        return geometric(n_heads)\n"
            "    return np.concatenate([geometric(p), geometric(2 * p)[0::2][: n_heads - p]])\n")
        page.keyboard.press("Shift+Enter")
        page.keyboard.press("Shift+Enter")
        expect(test_cell.locator(".jp-OutputArea")).to_contain_text("paper_slopes: 4 visible checks pass")
        test_cell.scroll_into_view_if_needed()
        shot(page, "student-4-answer-passes")

        # a classic mistake: the exponents start at 0. The check names it, without giving the answer away
        wrong = code_cell("def textbook_slopes")
        wrong.locator(".cm-content").click()
        page.keyboard.press("Control+a")
        page.keyboard.insert_text("def textbook_slopes(n_heads):\n    return 0.5 ** np.arange(n_heads)\n")
        page.keyboard.press("Shift+Enter")
        page.keyboard.press("Shift+Enter")
        verdict = code_cell('check("textbook_slopes", textbook_slopes)').locator(".jp-OutputArea")
        expect(verdict).to_contain_text("Hint: the exponents start at 0")
        mistake = "textbook_slopes(2): 2 of 2 entries are off. Worst: [0] expected 0.5, got 1"
        expect(verdict).to_contain_text(mistake)
        shot(page, "student-4b-mistake-named")

        # nbgrader's Validate, from the notebook's toolbar
        page.keyboard.press("Control+s")
        expect(page.locator(".lm-TabBar-tab.jp-mod-dirty")).to_have_count(0)  # saved before Validate reads it
        page.get_by_role("button", name="Validate").first.click()
        dialog = page.locator(".jp-Dialog")
        dialog.wait_for()
        expect(dialog).not_to_contain_text("Validating", timeout=120_000)
        shot(page, "student-5-validated")
        text = dialog.inner_text()
        # Validate gives the checks' own verdicts: the mistake with its message, the right answer not at all
        assert mistake in text, text[:2000]
        assert "paper_slopes(" not in text, text[:2000]

    # grading the saved notebook reaches the same verdicts, outside the kernel
    from autograder.grade import grade

    submitted = tmp_path / "submissions" / "student"
    submitted.mkdir(parents=True)
    shutil.copy(tmp_path / "course" / "alibi" / "01_slopes_and_bias.ipynb", submitted)
    prepared_like(graded_sample_class[0], tmp_path / "grading")
    grade(tmp_path / "submissions", tmp_path / "grading", cell_timeout=20, timeout=60, workers=1, progress=False)
    with open(tmp_path / "grading" / "grades.csv") as f:
        row = next(r for r in csv.DictReader(f) if r["notebook"] == "01_slopes_and_bias")
    assert f"test_textbook_slopes (CheckFailed: {mistake}" in row["reason"], row["reason"]
    assert "test_paper_slopes" not in row["reason"] and float(row["score"]) == 3.0, row


def test_instructor_sees_the_graded_class_in_formgrader(graded_sample_class, browser_page):
    page = browser_page
    out, report, _ = graded_sample_class
    course = out / "course"
    (course / "nbgrader_config.py").write_text(
        "c = get_config()  # noqa: F821\n"
        "c.CourseDirectory.root = '.'\n"
        "c.CourseDirectory.course_id = 'alibi'\n"
        "c.CourseDirectory.source_directory = 'source'\n"
        f"c.CourseDirectory.db_url = 'sqlite:///{out / 'gradebook.db'}'\n")
    with jupyterlab(course) as url:
        page.goto(f"{url}/formgrader?token={TOKEN}")
        assignments = page.locator("#main_table, table").first
        expect(assignments).to_contain_text("alibi")
        shot(page, "instructor-1-assignments")
        page.goto(f"{url}/formgrader/manage_students?token={TOKEN}")
        students = page.locator("table").first
        for student in ("ada", "cy", "hal", "oli"):
            expect(students).to_contain_text(student)
        full = sum(report.max_scores().values())
        expect(students.locator("tr").filter(has_text="ada")).to_contain_text(f"{full:g}")
        shot(page, "instructor-2-students")
