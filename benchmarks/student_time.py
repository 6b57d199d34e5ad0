"""How long a student needs for each notebook, estimated from what it asks them to read, write and code.

    .venv/bin/python benchmarks/student_time.py [--markdown] [--write]

``--write`` puts each estimate into its notebook's opening in solutions/, from the text of the release in course/:
after a notebook changes, `make release`, then ``--write``, then `make release` again to carry the time to
course/ (tests/test_notebooks.py holds the stated times to the estimate).

What is counted, per notebook:
- reading: the words of the release's text (prompts, hints, questions) and of the code it hands out;
- writing: the length each written question asks for, at its upper end ("3 to 5 sentences": 5 sentences of
  20 words; a paragraph: 100 words; a line of a derivation: 10 words);
- coding: the lines the student writes, the solutions' answer cells without blanks and comments.

The rates, each as a range from a fast to a slow student:
- prose at 180 to 130 words per minute: Rice University's Course Workload Estimator, "reading to understand
  the meaning of each sentence" with some and with many new concepts (its table, as Champlain College quotes it:
  elearning.champlain.edu/kb/course-workload-considerations/);
- code handed out at 130 to 65 words per minute: the same table, understanding to "engage" (reading while working
  on problems), many new concepts;
- writing at 45 to 90 minutes per 250-word page: the estimator's low-planning writers, "as little as 45 minutes
  per page" (wac.gmu.edu's copy of it), to twice that;
- code at 1 to 3 minutes per line written, running the checks and fixing after their feedback included: no
  published rate for students was found, so this range is this project's assumption, and the figure most worth
  measuring with real students.
A notebook states the range, fast to slow, rounded to 5 minutes (half-hours past two hours).
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
RELEASE, SOLUTIONS = ROOT / "course" / "alibi", ROOT / "solutions" / "alibi"
PROSE_WPM = (180, 130)
CODE_READ_WPM = (130, 65)
WRITING_MIN_PER_PAGE, WORDS_PER_PAGE = (45, 90), 250
MINUTES_PER_LINE = (1, 3)
WORD = re.compile(r"[A-Za-z0-9_]+")
HINTS = re.compile(r"<details>.*?</details>", re.S)
ASKED = re.compile(r"\*A full answer \(\d+ points?, ([^)]*)\)")
STATED = re.compile(r"\*\*Time:\*\* ([^*(]*?)(?: \([^)]*\))?\. (?=\*\*Points)")


@dataclass
class Workload:
    prose_words: int
    code_read_words: int
    answer_words: int
    lines_written: int

    def minutes(self, pace: int) -> float:
        """Minutes at pace 0 (fast) or 1 (slow)."""
        return (self.prose_words / PROSE_WPM[pace] + self.code_read_words / CODE_READ_WPM[pace]
                + self.answer_words / WORDS_PER_PAGE * WRITING_MIN_PER_PAGE[pace]
                + self.lines_written * MINUTES_PER_LINE[pace])


def _role(cell) -> dict:
    return cell.metadata.get("nbgrader", {})


def workload(name: str) -> Workload:
    release = nbformat.read(RELEASE / f"{name}.ipynb", as_version=4)
    solution = nbformat.read(SOLUTIONS / f"{name}.ipynb", as_version=4)
    # the release's text as the student reads it, without the time this estimate states (it would count itself)
    prose = sum(len(WORD.findall(STATED.sub("", c.source))) for c in release.cells if c.cell_type == "markdown"
                and not _role(c).get("solution"))
    handed_out = sum(len(WORD.findall(c.source)) for c in release.cells if c.cell_type == "code"
                     and not _role(c).get("solution"))
    answers = sum(words_asked(c.source) for c in release.cells if c.cell_type == "markdown")
    written = sum(_lines_written(c.source) for c in solution.cells
                  if c.cell_type == "code" and _role(c).get("solution"))
    return Workload(prose, handed_out, answers, written)


def words_asked(text: str) -> int:
    """The words a full answer takes, from what the question asks ("*A full answer (2 points, 3 to 5 sentences)")."""
    asked = 0
    for wanted in ASKED.findall(text):
        counted = re.search(r"(\d+) (sentences|lines)", wanted)
        if counted:
            asked += int(counted.group(1)) * (20 if counted.group(2) == "sentences" else 10)
        else:  # "one or two paragraphs", "one short paragraph each" (each of three parts)
            asked += 100 * (2 if "two paragraphs" in wanted else 3 if "each" in wanted else 1)
    return asked


def _lines_written(source: str) -> int:
    """The answer's lines: inside BEGIN/END SOLUTION where the cell marks them, without blanks and comments."""
    inside = re.findall(r"### BEGIN SOLUTION\n(.*?)### END SOLUTION", source, re.S) or [source]
    return sum(1 for part in inside for line in part.splitlines() if line.strip() and not line.strip().startswith("#"))


def estimate(name: str) -> str:
    """What the notebook states: '45 to 95 minutes', or in hours past two hours."""
    w = workload(name)
    fast, slow = w.minutes(0), w.minutes(1)
    if slow <= 120:
        return f"{5 * round(fast / 5)} to {5 * round(slow / 5)} minutes"
    return f"{_hours(fast)} to {_hours(slow)} hours"


def _hours(minutes: float) -> str:
    return f"{round(minutes / 30) / 2:g}"


def stated(name: str) -> str:
    found = STATED.search(nbformat.read(SOLUTIONS / f"{name}.ipynb", as_version=4).cells[0].source)
    return found.group(1) if found else "(none)"


def write(name: str) -> None:
    path = SOLUTIONS / f"{name}.ipynb"
    nb = nbformat.read(path, as_version=4)
    opening = nb.cells[0]
    if not STATED.search(opening.source):
        raise ValueError(f"{path}: its first cell states no time (expected '**Time:** ... . **Points:**')")
    opening.source = STATED.sub(f"**Time:** {estimate(name)} (estimated from what it asks you to read, write and "
                                "code). ", opening.source)
    nbformat.write(nb, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", action="store_true", help="a Markdown table instead of plain columns")
    parser.add_argument("--write", action="store_true", help="state each estimate in its notebook (solutions/)")
    args = parser.parse_args()
    header = ["notebook", "prose words", "code read", "answer words", "lines", "fast min", "slow min", "stated"]
    rows, total = [], [0.0, 0.0]
    for path in sorted(SOLUTIONS.glob("*.ipynb")):
        if args.write:
            write(path.stem)
        w = workload(path.stem)
        fast, slow = w.minutes(0), w.minutes(1)
        total = [total[0] + fast, total[1] + slow]
        rows.append([path.stem, w.prose_words, w.code_read_words, w.answer_words, w.lines_written, round(fast),
                     round(slow), stated(path.stem)])
    rows.append(["total", "", "", "", "", round(total[0]), round(total[1]),
                 f"{total[0] / 60:.1f} to {total[1] / 60:.1f} hours"])
    if args.markdown:
        print("| " + " | ".join(header) + " |\n|" + "---|" * len(header))
        print("\n".join("| " + " | ".join(map(str, r)) + " |" for r in rows))
    else:
        print("  ".join(f"{h:>12}" for h in header))
        print("\n".join("  ".join(f"{c!s:>12}" for c in r) for r in rows))


if __name__ == "__main__":
    main()
