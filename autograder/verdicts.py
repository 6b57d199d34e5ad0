"""The verdict of each test cell, reached in the grader's own process.

The notebooks' test cells call ``check(...)`` (``alibi_ref.course.checks``). Under the autograder
the kernel only runs the student's answer on the cases the grader drew and hands the values back
as a display output; nothing there judges. ``JudgeChecks`` runs after the sandboxed execution and
before nbgrader's ``SaveAutoGrades``: for each test cell it reads the values handed back for
every ``check`` call in the cell's own source (restored from the gradebook, so the student cannot
have changed it), has the course's ``judge`` compare them with the reference here, and leaves
the cell failed (an error output with the verdict) or passed (the verdict as printed text). The
handed-back values are removed from the notebook. A check whose values never came back fails.

Each check is judged from a run whose view of the course's package holds exactly the helpers its
exercise may use (the course's ``views_of``): a notebook whose checks see different helpers is run
once more per other view (``SandboxedExecute.run_again``). A downstream check that failed beside a
failed upstream one is judged again from a rescue run that lends it the reference's upstream answers.
What else a checked test cell showed (prints, notes on stderr, a progress bar, displays) is dropped:
its score comes from the verdicts and from whether the cell raised, never from what else it printed
(nbgrader fails any cell with stderr), and nothing a cell of the student's made it print (a hidden
test's source, say) reaches the feedback.

``RecordOutcome`` then writes the notebook's outcome (status, reason, failed cells) for the grade
table, after the verdicts are in.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

from nbformat import NotebookNode
from nbgrader.preprocessors import NbGraderPreprocessor
from traitlets import Unicode

from . import outcomes

# a test cell's metadata while it is judged: bytes its sandbox's memory rose while it ran (``execute``'s meter)
PEAK_RISE = "autograder_peak_rise"


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


def source_check_calls(folder: Path) -> list[tuple[str, int | None]]:
    """Every (exercise, hidden seed) the test cells of the notebooks in ``folder`` (an assignment's source) call."""
    import nbformat

    calls = []
    for path in sorted(folder.glob("*.ipynb")):
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type == "code" and cell.metadata.get("nbgrader", {}).get("grade"):
                calls += [call for call in check_calls(cell.source) if call not in calls]
    return calls


def read_secret(path: str | Path) -> bytes | None:
    """The grader's secret for the hidden cases, from its file (hex); None where there is none."""
    return bytes.fromhex(Path(path).read_text().strip()) if path else None


def save_expected_values(checks_module: str, source: Path, path: Path, secret: bytes | None = None) -> bool:
    """Compute the reference's values for every check the assignment's test cells make, once for the
    whole class (``JudgeChecks.expected_dir`` then lends them to each judging process). False where
    the course's checks module does not offer it or no test cell calls ``check``."""
    checks = importlib.import_module(checks_module)
    calls = source_check_calls(source)
    if not calls or not hasattr(checks, "save_expected"):
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    checks.save_expected(path.with_suffix(".tmp"), calls, secret)
    path.with_suffix(".tmp").replace(path)
    return True


_LOADED: dict[str, float] = {}  # an expected values file -> its mtime when this process loaded it


class JudgeChecks(NbGraderPreprocessor):
    checks_module = Unicode("", help="The course's grading module (this course's nbgrader_config.py names "
                                     "alibi_ref.course.grading): MIME (the payloads' type), judge(payload, secret) -> "
                                     "Verdict, Verdict, and where it has views (views_of, upstream_of) the runs of "
                                     "other views and rescue runs; none: test cells are graded as nbgrader grades "
                                     "them").tag(config=True)
    expected_dir = Unicode("", help="Where ASSIGNMENT.pickle holds the reference's values for its checks, "
                                    "computed once (save_expected_values); none: each process computes them"
                           ).tag(config=True)
    hidden_cases_key = Unicode("", help="The file with the grader's secret, with which the grader drew the "
                                        "hidden cases the kernels ran").tag(config=True)

    def preprocess(self, nb, resources):
        if not self.checks_module:
            return nb, resources
        checks = importlib.import_module(self.checks_module)
        self._secret = read_secret(self.hidden_cases_key)
        self._load_expected(checks, resources.get("nbgrader", {}).get("assignment"))
        run_again, seen = resources.pop("autograder_run_again", None), resources.pop("autograder_view", None)
        if resources.get("autograder_outcome", {}).get("status") == "timeout":
            run_again = None  # it is graded again alone, with longer limits (timeouts.py): the other runs then
        graded = {i: check_calls(cell.source) for i, cell in enumerate(nb.cells)
                  if cell.cell_type == "code" and cell.metadata.get("nbgrader", {}).get("grade")}
        views = checks.views_of([c for calls in graded.values() for c in calls]) if run_again else {}
        runs = {seen: nb}  # view key -> the notebook as run in that view
        for key in sorted(set(views.values()) - {seen}):
            runs[key] = self._ran(run_again(checks.helpers_in(key)), resources)
        # measured outside the kernel (only where the course's measures_memory asks), read in place of what it says
        rises = {(key, i): run.cells[i].metadata.pop(PEAK_RISE, None) for key, run in runs.items() for i in graded}
        verdicts = {}
        for i, calls in graded.items():
            for call in calls:
                ran = runs[views.get(call, seen)].cells[i]
                rise = rises[views.get(call, seen), i]
                verdicts[i, call] = self._verdict(*call, self._payloads(ran, checks), checks,
                                                  not _errors(ran.get("outputs", [])), self._secret, peak_rise=rise)
        if run_again:
            self._rescue(nb, checks, graded, views, verdicts, run_again, resources)
        for cell in nb.cells:  # the values handed back go, checked test cell or not
            cell.outputs = [o for o in cell.get("outputs", []) if not _handed_back(o, checks)]
        for i, calls in graded.items():
            if not calls:
                continue  # not a checked test cell: nbgrader's own rule (an error fails it) stands
            # why the cell stopped, as it ran in the view of its last check: the view the whole cell was written for
            errors = _errors(runs[views.get(calls[-1], seen)].cells[i].get("outputs", []))
            found = [v for c in calls if (v := verdicts[i, c]) is not None]
            # the checks that did run say why first; then why the cell stopped, if it did
            nb.cells[i].outputs = ([NotebookNode(output_type="stream", name="stdout", text=v.message + "\n")
                                    for v in found if v.passed]
                                   + [error_output("CheckFailed", v.message) for v in found if not v.passed] + errors)
        return nb, resources

    @staticmethod
    def _ran(run, resources):
        """The notebook as a run in another view left it. A run that ran out of time makes the whole notebook's
        outcome a timeout, so that it is graded again alone with scaled limits (timeouts.py): the verdicts that
        run owed would otherwise be missing, and a busy machine would cost points."""
        ran, outcome = run
        if outcome.get("status") == "timeout" and "autograder_outcome" in resources:
            resources["autograder_outcome"] = {**resources["autograder_outcome"], "status": "timeout",
                                               "reason": f"in a run in another view: {outcome.get('reason', '')}"}
        return ran

    def _rescue(self, nb, checks, graded, views, verdicts, run_again, resources) -> None:
        """Judge each failed downstream check again from a run that lends it the reference's version of the upstream
        answers that failed their own checks (``Exercise.upstream``): one mistake costs one exercise. The run's view
        holds those and the check's own helpers, so only this check's verdict is read from it."""
        failed = {call[0] for (_, call), v in verdicts.items() if v is not None and not v.passed}
        wanted: dict[tuple, list] = {}
        for (i, call), verdict in verdicts.items():
            lent = tuple(sorted(set(checks.upstream_of(call[0])) & failed))
            if verdict is not None and not verdict.passed and lent:
                wanted.setdefault((views.get(call), lent), []).append((i, call))
        for (key, lent), calls in sorted(wanted.items()):
            rescued = self._ran(run_again(checks.helpers_in(key), lent), resources)
            for cell in rescued.cells:
                cell.metadata.pop(PEAK_RISE, None)
            for i, call in calls:
                verdict = self._verdict(*call, self._payloads(rescued.cells[i], checks, rescue_run=True), checks,
                                        False, self._secret, rescue=True)
                if verdict is not None and verdict.passed:  # every payload for the call passed, as in any run
                    verdicts[i, call] = verdict

    def _load_expected(self, checks, assignment) -> None:
        path = Path(self.expected_dir) / f"{assignment}.pickle"
        if not (self.expected_dir and assignment and path.exists() and hasattr(checks, "load_expected")):
            return
        mtime = path.stat().st_mtime
        if _LOADED.get(str(path)) != mtime:
            checks.load_expected(path)
            _LOADED[str(path)] = mtime

    @staticmethod
    def _payloads(cell, checks, rescue_run: bool = False) -> list:
        """The values handed back in ``cell``. Results made with the reference's upstream answers are read only
        from a rescue run, whose view lent them: anywhere else they are the student's to make up."""
        payloads = [o.data[checks.MIME] for o in cell.get("outputs", []) if _handed_back(o, checks)]
        return payloads if rescue_run else [{k: v for k, v in p.items() if k != "with_reference_upstream"}
                                            if isinstance(p, dict) else p for p in payloads]

    @staticmethod
    def _verdict(name, seed, payloads, checks, must_have_run: bool, secret: bytes | None = None, rescue=False,
                 peak_rise: int | None = None):
        """The verdict on the values handed back for one check call: the first that fails, where a cell showed
        several (a guess per payload wins nothing); None where none came back because the cell stopped before it
        (its error says why). ``rescue``: the results made with the upstream answers a rescue run lent.
        ``peak_rise``: how far the sandbox's memory rose while the cell ran, where the grader measured it."""
        measured = {} if peak_rise is None else {"peak_rise": peak_rise}
        verdicts = []
        for payload in payloads:
            if isinstance(payload, dict) and payload.get("exercise") == name and payload.get("seed") == seed:
                try:
                    verdicts.append(checks.judge(payload, secret, rescue=True) if rescue
                                    else checks.judge(payload, secret, **measured))
                except (ValueError, KeyError, TypeError) as err:
                    verdicts.append(checks.Verdict(False, f"{name}: the values handed back could not be read "
                                                          f"({type(err).__name__}: {err})"))
        if not verdicts:
            return checks.Verdict(False, f"{name}: no results came back from the kernel (the cell stopped early, "
                                         "or check was replaced)") if must_have_run else None
        return next((v for v in verdicts if not v.passed), verdicts[0])


def _handed_back(output, checks) -> bool:
    return output.get("output_type") == "display_data" and checks.MIME in output.get("data", {})


def _errors(outputs) -> list:
    return [o for o in outputs if o.get("output_type") == "error"]


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
        path = outcomes.outcome_path(Path(self.state_dir), ids["student"], ids["assignment"], ids["notebook"])
        outcomes.write(path, {**outcome, "failed": failed})
        return nb, resources
