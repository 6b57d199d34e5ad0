"""Build the sample class in autograder/sample_class/submissions from the release and the solutions.

    .venv/bin/python -m autograder.make_sample_class

Each student is the release notebook with the answer cells filled from the solutions, then
changed the way real students change them: the mistakes people make, a crash, loops, edited
and deleted test cells, attempts to cheat. What each should score is in expected.csv.
"""

from __future__ import annotations

import re
import shutil
import zipfile
from pathlib import Path

import nbformat

REPO = Path(__file__).resolve().parents[1]
RELEASE = REPO / "course" / "alibi"
SOLUTIONS = REPO / "solutions" / "alibi"
OUT = Path(__file__).resolve().parent / "sample_class" / "submissions"


def _solution_sources(name: str) -> dict[str, str]:
    nb = nbformat.read(SOLUTIONS / f"{name}.ipynb", as_version=4)
    sources = {}
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("solution"):
            text = re.sub(r"^[ \t]*### (BEGIN|END) SOLUTION[ \t]*\n", "", cell.source, flags=re.M)
            sources[meta["grade_id"]] = text
    return sources


def filled(name: str, edits: dict | None = None, unanswered=()) -> nbformat.NotebookNode:
    """The release notebook ``name`` answered with the solutions, then ``edits``: grade_id -> (old, new)."""
    nb = nbformat.read(RELEASE / f"{name}.ipynb", as_version=4)
    answers = _solution_sources(name)
    for cell in nb.cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if grade_id in answers and grade_id not in unanswered:
            cell.source = answers[grade_id]
        for old, new in (edits or {}).get(grade_id, []):
            assert old in cell.source, (name, grade_id, old)
            cell.source = cell.source.replace(old, new)
    return nb


def cell(nb, grade_id):
    return next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)


NOTEBOOKS = sorted(p.stem for p in RELEASE.glob("*.ipynb"))


def students() -> dict[str, dict[str, object]]:
    s: dict[str, dict[str, object]] = {}
    # full marks, every notebook
    s["ada"] = {name: filled(name) for name in NOTEBOOKS}
    # partial: two notebooks, the second half done
    s["ben"] = {"01_slopes_and_bias": filled("01_slopes_and_bias"),
                "02_worked_example": filled("02_worked_example", unanswered=("multi_head", "sat_rows", "sat_answer"))}
    # the paper's slopes stretched into one geometric sequence: wrong for 12 heads
    s["cy"] = {"01_slopes_and_bias": filled("01_slopes_and_bias", {"paper_slopes": [
        ("    if p == n_heads:\n        return geometric(n_heads)\n",
         "    return geometric(n_heads)\n")]})}
    # the 1/sqrt(d) forgotten
    s["dee"] = {"02_worked_example": filled("02_worked_example", {"alibi_head": [
        ("scaled = scores / np.sqrt(d_k)", "scaled = scores")]})}
    # a flipped sign: nearby tokens punished, far ones favoured
    s["eve"] = {"01_slopes_and_bias": filled("01_slopes_and_bias", {"alibi_bias": [
        ("bias = -slopes[:, None, None]", "bias = slopes[:, None, None]")]})}
    # symmetric where causal was asked
    s["fay"] = {"04_causal": filled("04_causal", {"causal_alibi_scores": [
        ("- slope * (i - j)\n    return np.where(j > i, -np.inf, scores)",
         "- slope * np.abs(i - j)\n    return scores")]})}
    # the decode offset forgotten: the new query treated as position 0
    s["gus"] = {"01_slopes_and_bias": filled("01_slopes_and_bias", {"alibi_bias": [
                    ("i = np.arange(q_len)[:, None] + (k_len - q_len)", "i = np.arange(q_len)[:, None]")]}),
                "04_causal": filled("04_causal", {"decode_step": [
                    ("- slope * (t - np.arange(t + 1))", "- slope * np.arange(t + 1)")]})}
    # ends its kernel half-way: the softmax before it keeps its point
    s["hal"] = {"02_worked_example": filled("02_worked_example", {"alibi_head": [
        ("    N, d_k = Qh.shape\n", "    N, d_k = Qh.shape\n    exit()\n")]})}
    # an infinite loop: interrupted at the cell limit
    s["ivy"] = {"05_schedules": filled("05_schedules", {"schedules": [
        ('    h = np.arange(1, n_heads + 1)\n', '    while True:\n        pass\n')]})}
    # a loop that swallows the interrupt: stopped at the notebook limit
    s["jay"] = {"03_slope_zero": filled("03_slope_zero", {"standard_attention": [
        ("    d_k, d_v =", "    while True:\n        try:\n            pass\n        except KeyboardInterrupt:\n"
                         "            pass\n    d_k, d_v =")]})}
    # a wrong answer behind an edited test cell, and a deleted test cell
    jon = filled("01_slopes_and_bias", {"paper_slopes": [
        ("    p = 2 ** int", "    return np.zeros(n_heads)\n    p = 2 ** int")]})
    cell(jon, "test_paper_slopes").source = "print('paper_slopes: all visible checks pass')"
    jon.cells.remove(cell(jon, "test_textbook_slopes"))
    s["jon"] = {"01_slopes_and_bias": jon}
    # hands back the reference's answer, reached without an import
    s["kim"] = {"01_slopes_and_bias": filled("01_slopes_and_bias", {"paper_slopes": [
        ("    def geometric(n):",
         "    return plots.get_slopes(n_heads, max_bias=max_bias)\n\n    def geometric(n):")]})}
    # one notebook cut off mid-file, another fine, handed in as a zip
    s["lou.zip"] = {"01_slopes_and_bias": nbformat.writes(filled("01_slopes_and_bias"))[:3000],
                    "02_worked_example": filled("02_worked_example")}
    # asks for far more memory than a kernel gets
    s["max"] = {"03_slope_zero": filled("03_slope_zero", {"standard_attention": [
        ("    d_k, d_v =", "    workspace = np.ones((2**31,))\n    d_k, d_v =")]})}
    # correct, but warns
    s["ned"] = {"02_worked_example": filled("02_worked_example", {"softmax": [
        ('    x = np.asarray(x, dtype=np.float64)\n',
         '    import warnings\n\n    warnings.warn("softmax: casting to float64")\n'
         '    x = np.asarray(x, dtype=np.float64)\n')]})}
    # tries to read the solutions and the gradebook, to leave a process behind, and to patch numpy
    s["oli"] = {"01_slopes_and_bias": filled("01_slopes_and_bias", {"textbook_slopes": [
        ("    return 0.5 ** np.arange(1, n_heads + 1)",
         "    for secret in ['" + str(REPO / "solutions/alibi/01_slopes_and_bias.ipynb") + "', '"
         + str(REPO / "grading/gradebook.db") + "']:\n"
         "        try:\n"
         "            print('read', len(np.fromfile(secret, dtype=np.uint8)), 'bytes of', secret)\n"
         "        except OSError as err:\n"
         "            print('cannot read', secret, '-', type(err).__name__)\n"
         "    return 0.5 ** np.arange(1, n_heads + 1)")]}),
        "02_worked_example": filled("02_worked_example", {"softmax": [
            ("def softmax(x):", "np.testing.assert_allclose = lambda *args, **kwargs: None\n\n\ndef softmax(x):"),
            ("    e = np.exp(", "    return np.zeros_like(x)\n    e = np.exp(")]})}
    # a correct notebook with a cell of its own that claims 100 points
    pat = filled("02_worked_example")
    bonus = nbformat.v4.new_code_cell("print('bonus')", id="bonus-cell")
    bonus.metadata["nbgrader"] = {"grade": True, "grade_id": "bonus", "locked": True, "points": 100,
                                  "schema_version": 3, "solution": False, "task": False}
    pat.cells.append(bonus)
    s["pat"] = {"02_worked_example": pat}
    return s


def main() -> None:
    shutil.rmtree(OUT, ignore_errors=True)
    OUT.mkdir(parents=True)
    for student, notebooks in students().items():
        texts = {name: nb if isinstance(nb, str) else nbformat.writes(nb) for name, nb in notebooks.items()}
        if student.endswith(".zip"):
            with zipfile.ZipFile(OUT / student, "w") as archive:
                for name, text in texts.items():
                    info = zipfile.ZipInfo(f"{student[:-4]}/{name}.ipynb", date_time=(2026, 1, 1, 0, 0, 0))
                    archive.writestr(info, text)
            continue
        folder = OUT / student / "alibi"  # nbgrader's submitted/ layout for the folders
        folder.mkdir(parents=True)
        for name, text in texts.items():
            (folder / f"{name}.ipynb").write_text(text)
    print(f"wrote {len(students())} students to {OUT.relative_to(REPO)}")


if __name__ == "__main__":
    main()
