"""The verdict of each test cell, reached in the grader's own process.

The notebooks' test cells call ``check(...)`` (``alibi_ref.course.checks``). Under the autograder
the kernel only runs the student's answer on the exercise's cases and hands the values back as a
display output; nothing there judges. ``JudgeChecks`` runs after the sandboxed execution and
before nbgrader's ``SaveAutoGrades``: for each test cell it reads the values handed back for
every ``check`` call in the cell's own source (restored from the gradebook, so the student cannot
have changed it), has the course's ``judge`` compare them with the reference here, and leaves
the cell failed (an error output with the verdict) or passed (the verdict as printed text). The
handed-back values are removed from the notebook. A check whose values never came back fails.

``RecordOutcome`` then writes the notebook's outcome (status, reason, failed cells) for the grade
table, after the verdicts are in.
"""

from __future__ import annotations

import ast
import importlib
import json
from pathlib import Path

from nbformat import NotebookNode
from nbgrader.preprocessors import NbGraderPreprocessor
from traitlets import Unicode


def error_output(ename: str, evalue: str) -> NotebookNode:
    return NotebookNode(output_type="error", ename=ename, evalue=evalue, traceback=[f"{ename}: {evalue}"])


def check_calls(source: str) -> list[tuple[str, int | None]]:
    """(exercise, hidden seed) of every ``check("name", ..., hidden=SEED)`` call written in ``source``."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    calls = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "check" and node.args
                and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            seeds = [k.value.value for k in node.keywords if k.arg == "hidden" and isinstance(k.value, ast.Constant)]
            seed = seeds[0] if seeds else None
            calls.append((node.args[0].value, seed))
    return calls


class JudgeChecks(NbGraderPreprocessor):
    checks_module = Unicode("alibi_ref.course.checks", help="The module with MIME (the payloads' type), "
                                                           "judge(payload) -> Verdict and Verdict").tag(config=True)

    def preprocess(self, nb, resources):
        checks = importlib.import_module(self.checks_module)
        for cell in nb.cells:
            if cell.cell_type == "code":
                self._judge_cell(cell, checks)
        return nb, resources

    def _judge_cell(self, cell, checks) -> None:
        payloads = [o.data[checks.MIME] for o in cell.get("outputs", [])
                    if o.get("output_type") == "display_data" and checks.MIME in o.get("data", {})]
        cell.outputs = [o for o in cell.get("outputs", [])
                        if not (o.get("output_type") == "display_data" and checks.MIME in o.get("data", {}))]
        meta = cell.metadata.get("nbgrader", {})
        required = check_calls(cell.source) if meta.get("grade") else []
        if not required:
            return  # not a checked test cell: nbgrader's own rule (an error fails it) stands
        stopped = next((n for n, o in enumerate(cell.outputs) if o.output_type == "error"), None)
        verdicts = [self._verdict(name, seed, payloads, checks, stopped is None) for name, seed in required]
        failed = [error_output("CheckFailed", v.message) for v in verdicts if v is not None and not v.passed]
        passed = [NotebookNode(output_type="stream", name="stdout", text=v.message + "\n")
                  for v in verdicts if v is not None and v.passed]
        if stopped is None:
            cell.outputs += passed + failed
        else:  # the cell raised, crashed or was stopped: the checks that did run say why first
            cell.outputs[stopped:stopped] = passed + failed

    @staticmethod
    def _verdict(name, seed, payloads, checks, must_have_run: bool):
        """The verdict on the values handed back for one check call; None where they did not come back
        because the cell stopped before it (its error says why)."""
        verdicts = []
        for payload in payloads:
            if isinstance(payload, dict) and payload.get("exercise") == name and payload.get("seed") == seed:
                try:
                    verdicts.append(checks.judge(payload))
                except (ValueError, KeyError, TypeError) as err:
                    verdicts.append(checks.Verdict(False, f"{name}: the values handed back could not be read "
                                                          f"({type(err).__name__}: {err})"))
        if not verdicts:
            return checks.Verdict(False, f"{name}: no results came back from the kernel (the cell stopped early, "
                                         "or check was replaced)") if must_have_run else None
        return next((v for v in verdicts if not v.passed), verdicts[0])


class RecordOutcome(NbGraderPreprocessor):
    """Write the notebook's outcome JSON (status, reason, failed test cells, seconds) for the grade table."""

    state_dir = Unicode("", help="Where each notebook's outcome is written as JSON").tag(config=True)

    def preprocess(self, nb, resources):
        outcome = resources.get("autograder_outcome")
        if not self.state_dir or outcome is None:
            return nb, resources
        ids = resources["nbgrader"]
        failed = {}
        for cell in nb.cells:
            meta = cell.metadata.get("nbgrader", {})
            errors = [o for o in cell.get("outputs", []) if o.output_type == "error"]
            if meta.get("grade") and cell.cell_type == "code" and errors:
                message = " ".join(str(errors[0].get("evalue", "")).split())[:400]
                failed[meta["grade_id"]] = f"{errors[0].ename}: {message}" if message else errors[0].ename
        path = Path(self.state_dir) / ids["student"] / ids["assignment"] / f"{ids['notebook']}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({**outcome, "failed": failed}))
        return nb, resources
