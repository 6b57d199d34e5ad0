"""nbgrader's Execute step, run in the sandbox, and never letting one notebook sink the others.

nbgrader's own Execute raises when a kernel dies, and nbgrader then discards the student's
whole submission, passing cells included. This one records what happened instead:

- a cell that dies (the kernel crashed, ran out of memory or exited) or runs past the
  notebook's time limit gets an error output saying so, and every cell after it a
  "not run" error, so those test cells score 0 while the cells before keep their points;
- an answer cell flagged by the static screen (``screen.py``: it reaches for the reference)
  fails its own exercise's test cell;
- a cell's output past ``output_limit`` is left out as it arrives, with a note saying how much: a
  loop that prints until its time limit grew the grading process by about 2.5 GB in 20 s, for every
  worker grading such a notebook at once; errors and the checks' values are always kept;
- the outcome (status, reason, seconds) goes into the resources, for ``verdicts.RecordOutcome``
  to write once the verdicts are in.
"""

from __future__ import annotations

import copy
import importlib
import json
import shutil
import tempfile
import time
import traceback
from pathlib import Path

from jupyter_core.utils import run_sync
from nbclient.client import NotebookClient
from nbclient.exceptions import CellTimeoutError, DeadKernelError
from nbformat import NotebookNode
from nbgrader.preprocessors import Execute
from traitlets import Bool, Enum, Integer, List, Unicode

from .compile_cache import lend
from .files import read_tail
from .sandbox import SandboxedKernelManager, SandboxPolicy, new_scratch
from .screen import (
    MODULES,
    fail_flagged_exercises,
    imported_modules,
    imported_names,
    module_sources,
    run_scripts,
    screen_notebook,
)
from .verdicts import PEAK_RISE, check_calls
from .verdicts import error_output as _error


class NotebookTimeout(Exception):
    pass


ERROR_TEXT = 4000  # characters of an error's message, and of each of its traceback's lines
ERROR_LINES = 40  # traceback lines kept: the last ones, where the error was raised


def bounded_error(content: dict) -> dict:
    """An error output's content within its budget (about 160 KB at most)."""
    def cut(text) -> str:
        text = str(text)
        return text if len(text) <= ERROR_TEXT else text[:ERROR_TEXT] + f"... [{len(text) - ERROR_TEXT:,} more]"

    traceback = list(content.get("traceback") or [])
    kept = [cut(line) for line in traceback[-ERROR_LINES:]]
    if len(traceback) > ERROR_LINES:
        kept.insert(0, f"[{len(traceback) - ERROR_LINES:,} traceback lines left out]")
    return {**content, "ename": cut(content.get("ename", ""))[:200], "evalue": cut(content.get("evalue", "")),
            "traceback": kept}


class KernelExited(Exception):
    pass


def _unreadable_message(err: ValueError) -> bool:
    """Whether ``err`` is jupyter_client's refusal of a message from the kernel (its signature did not
    match): a kernel stopping itself in the middle of its output sent such frames, and nbgrader would have
    discarded the student's whole submission for it."""
    frames = traceback.extract_tb(err.__traceback__)
    return bool(frames) and Path(frames[-1].filename).match("jupyter_client/session.py")


class SandboxedExecute(Execute):
    notebook_timeout = Integer(120, help="Seconds for the whole notebook, all cells together").tag(config=True)
    memory_limit = Integer(3 * 2**30, help="Bytes of address space for the kernel").tag(config=True)
    iopub_timeout = Integer(30, help="Seconds to wait, once a cell has replied, for the rest of its output: a loop "
                                     "that printed until it was interrupted leaves a backlog to read (nbclient "
                                     "waits 4 s, and a loaded grader took longer)").tag(config=True)
    tmp_limit = Integer(SandboxPolicy.tmp_bytes, help="Bytes each of the sandbox's /tmp and /dev/shm holds (memory "
                                                      "outside memory_limit)").tag(config=True)
    file_limit = Integer(SandboxPolicy.file_bytes, help="Bytes any one file the kernel writes may hold"
                         ).tag(config=True)
    disk_limit = Integer(SandboxPolicy.disk_bytes, help="Bytes the kernel's folder may hold, all files together "
                                                        "(looked at about once a second)").tag(config=True)
    disk_files = Integer(SandboxPolicy.disk_files, help="Files and folders the kernel's folder may hold"
                         ).tag(config=True)
    use_bwrap = Bool(True, help="Sandbox the kernel with bubblewrap").tag(config=True)
    fork_kernels = Bool(True, help="Fork each notebook's kernel from a zygote in the student's sandbox, which "
                                   "imports `preload` once per student (zygote.py)").tag(config=True)
    shutdown_kernel = Enum(["graceful", "immediate"], default_value="immediate",
                           help="How a notebook's kernel ends once its cells ran: its outputs are all in, its "
                                "folder is discarded, so it is killed (with what it started) rather than asked "
                                "to stop and waited for").tag(config=True)
    compile_cache_dir = Unicode("", help="Where ASSIGNMENT/ holds JAX's compilation cache filled from the "
                                         "released notebooks; each kernel gets a copy (compile_cache.py)"
                                ).tag(config=True)
    checks_module = Unicode("", help="The course's grading module (JudgeChecks.checks_module): its views of the "
                                     "package (views_of, write_view) and the variable its checks read the cases from "
                                     "(GRADING_ENV); none: kernels see no package of the course's").tag(config=True)
    views_dir = Unicode("", help="Where ASSIGNMENT/KEY holds each view of the course's package "
                                 "(prepare.prepare_kernel_files); none: kernels see no package of the course's"
                        ).tag(config=True)
    cases_dir = Unicode("", help="Where ASSIGNMENT.cases.json holds the inputs of the assignment's checks, shown to "
                                 "each kernel read-only").tag(config=True)
    preload = List(Unicode(), help="Modules the zygote imports before forking kernels: the course's heavy imports "
                                   "(numpy, torch, ...), those whose package the notebook that starts the zygote "
                                   "imports (a later one imports the rest itself); the kernel itself is always "
                                   "preloaded").tag(config=True)
    output_limit = Integer(2 * 2**20, help="Bytes of output a cell keeps (text, and images as they came); the rest "
                                           "is left out as it arrives, with a note. 0: no limit").tag(config=True)
    kept_whole = List(Unicode(), help="MIME types of the values a course's checks hand back (the grading module's "
                                      "MIME): kept up to check_output_limit, since a verdict reads them"
                      ).tag(config=True)
    check_output_limit = Integer(64 * 2**20, help="Bytes of kept_whole outputs a cell keeps, and the whole "
                                                  "notebook (the course's largest check hands back 0.4 MB)"
                                 ).tag(config=True)
    notebook_output_limit = Integer(32 * 2**20, help="Bytes of output (as output_limit counts them) all the cells "
                                                     "of a notebook keep together: a thousand cells each within "
                                                     "its own budget would still fill the grader").tag(config=True)

    def create_kernel_manager(self):
        self.km = self._sandboxed = SandboxedKernelManager(policy=self._policy, scratch=self._scratch,
                                                           zygote=self._zygote)
        return self.km

    forced_view = None  # (key, folder): the view a run again (``run_again``) sees, in place of the notebook's own

    def run_again(self, nb, resources, helpers: tuple[str, ...], lent: tuple[str, ...] = ()):
        """``nb`` (as it was before it ran) run once more, in a sandbox of its own whose view holds ``helpers`` and
        the reference's ``lent`` upstream answers: the executed notebook, for ``JudgeChecks`` to read the checks
        judged in that view from, and its outcome (a run that ran out of time has the notebook graded again)."""
        grading = importlib.import_module(self.checks_module)
        assignment = resources.get("nbgrader", {}).get("assignment", "")
        key = grading.view_key(helpers, lent)
        with tempfile.TemporaryDirectory(prefix="autograder-view-") as tmp:
            folder = Path(self.views_dir) / assignment / key
            if lent or not folder.is_dir():
                folder = grading.write_view(Path(tmp), helpers, lent)
            again = SandboxedExecute(parent=self.parent, config=self.config)
            again.fork_kernels = not lent  # a view lent answers serves one run: a zygote would outlast it
            again.forced_view = (key, str(folder))
            ran, ran_resources = again.preprocess(copy.deepcopy(nb), copy.deepcopy(resources))
        return ran, ran_resources["autograder_outcome"]

    def preprocess(self, nb, resources, km=None):
        # the assignment's data files (nbgrader copied the instructor's versions next to the notebook), and the
        # student's Python modules that the notebook imports, in a folder of their own (screen.MODULES)
        folder = Path(resources.get("metadata", {}).get("path") or ".")
        student_modules = imported_modules(nb, module_sources(folder / MODULES))
        findings = screen_notebook(nb, student_modules)
        assignment = resources.get("nbgrader", {}).get("assignment", "")
        key, course = course_sandbox(self.checks_module, self.views_dir, self.cases_dir, assignment, nb,
                                     self.forced_view)
        unrun = copy.deepcopy(nb)
        self._policy = SandboxPolicy(memory_bytes=self.memory_limit, use_bwrap=self.use_bwrap,
                                     tmp_bytes=self.tmp_limit, file_bytes=self.file_limit,
                                     disk_bytes=self.disk_limit, disk_files=self.disk_files, **course)
        self._zygote = self._student_zygote(resources, key, imported_names(nb))
        self._scratch = self._zygote.scratch() if self._zygote else new_scratch("kernel")
        for data in folder.iterdir() if folder.is_dir() else ():
            if data.is_file() and data.suffix != ".ipynb":
                shutil.copy(data, self._scratch / data.name)
        if student_modules:
            for name, source in student_modules.items():  # a package's files in its folders: mylib/core.py
                (self._scratch / MODULES / f"{name}.py").parent.mkdir(parents=True, exist_ok=True)
                (self._scratch / MODULES / f"{name}.py").write_text(source, encoding="utf-8")
            # a script the notebook %runs by file name is looked for in the working folder, as beside the
            # notebook in the student's Jupyter (screened like the modules: run_scripts, imported_modules);
            # never over a file of the assignment's own there, which nbgrader's files win over a student's too
            for name in run_scripts(nb)[0] & set(student_modules):
                if not (self._scratch / f"{name}.py").exists():
                    (self._scratch / f"{name}.py").write_text(student_modules[name], encoding="utf-8")
        if self.compile_cache_dir:
            lend(Path(self.compile_cache_dir) / resources.get("nbgrader", {}).get("assignment", ""), self._scratch, nb)
        start = time.monotonic()
        status, reason, stopped_at = "graded", "", None
        NotebookClient.__init__(self, nb, None)
        self.reset_execution_trackers()
        self._output_bytes, self._kept_bytes, self._left_out, self._sandboxed = {}, {}, {}, None
        self._check_assign_resources(resources)
        try:
            status, reason, stopped_at = self._run_cells(resources, start + self.notebook_timeout)
        finally:
            shutil.rmtree(self._scratch, ignore_errors=True)
        if stopped_at is not None:
            self._mark_not_run(stopped_at, reason)
        if findings:
            fail_flagged_exercises(self.nb, findings)
            status, reason = "flagged", "; ".join(str(f) for f in findings)
        elif status == "timeout" or (status == "graded" and any(self._timed_out(c) for c in self.nb.cells)):
            status, reason = "timeout", self._timeout_reason(stopped_at)
        self.resources["autograder_outcome"] = {"status": status, "reason": reason,
                                                "seconds": round(time.monotonic() - start, 2)}
        if key is not None and self.forced_view is None:
            # for JudgeChecks: the view this run saw, and a run of the notebook as it came in another one
            self.resources["autograder_view"] = key
            resources_then = {k: v for k, v in resources.items() if not k.startswith("autograder")}
            self.resources["autograder_run_again"] = lambda helpers, lent=(): self.run_again(
                unrun, resources_then, helpers, lent)
        return self.nb, self.resources

    def _student_zygote(self, resources, view, imported: set[str]):
        """The zygote of this student's job for ``view`` (its notebooks and runs in one view share a sandbox), or
        None: then the notebook gets a sandbox and kernel of its own. A new zygote preloads what of ``preload``
        the notebook imports (``imported``: top-level names): torch costs every zygote 1.6 s of CPU, and most
        notebooks never import it."""
        if not self.fork_kernels:
            return None
        from .zygote import ZygoteError, zygote_for

        ids = resources.get("nbgrader", {})
        try:
            preload = [name for name in self.preload if name.split(".")[0] in imported]
            return zygote_for((ids.get("student"), ids.get("assignment"), view), self._policy, preload)
        except ZygoteError as err:
            self.log.warning("%s; this notebook gets a kernel of its own", err)
            return None

    def _run_measured(self, cell, resources, index) -> None:
        """Run one cell; a test cell whose checks bound an answer's memory (the course's ``measures_memory``) with
        how far its sandbox's memory rose while it ran (``PEAK_RISE``), measured outside the kernel, for the judge
        to read in place of what the kernel says."""
        cell.metadata.pop(PEAK_RISE, None)  # a figure the notebook came with is the student's, never the meter's
        cgroup = self._sandboxed.sandbox_cgroup if self._measures_memory(cell) else None
        meter = cgroup.memory_meter() if cgroup is not None else None
        try:
            self.preprocess_cell(cell, resources, index)
        finally:
            if meter is not None:
                try:
                    cell.metadata[PEAK_RISE] = meter.rise()
                except OSError:  # the sandbox ended with the cell (a killed kernel of its own)
                    pass

    def _measures_memory(self, cell) -> bool:
        if not (self.checks_module and self._sandboxed is not None and cell.cell_type == "code"
                and cell.metadata.get("nbgrader", {}).get("grade")):
            return False
        grading = importlib.import_module(self.checks_module)
        return hasattr(grading, "measures_memory") and any(grading.measures_memory(name)
                                                            for name, _ in check_calls(cell.source))

    def _run_cells(self, resources, deadline):
        per_cell = self.timeout
        index = 0
        self._exit_asked = False
        self.on_cell_executed = self._watch_for_exit
        try:
            with self.setup_kernel():
                self.wait_for_reply(self.kc.kernel_info())
                for index, cell in enumerate(self.nb.cells):
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise NotebookTimeout
                    self.timeout = max(1, min(per_cell, int(remaining)))
                    self._run_measured(cell, resources, index)
                    if self._exit_asked:
                        raise KernelExited
                    # its folder's bounds, after each cell as well: nbclient asks about once a second while a cell
                    # runs, and a cell that writes fast ends between two asks
                    if not run_sync(self.km.is_alive)():
                        raise DeadKernelError(f"the kernel is gone after cell {index}")
        except NotebookTimeout:
            return "timeout", f"the notebook ran past its {self.notebook_timeout} s limit (at cell {index})", index
        except KernelExited:
            return ("crashed", f"the code in cell {index} ended the kernel (exit() or quit()); the cells after it "
                    "were not run", index + 1)
        except CellTimeoutError:  # nbclient's wait for the output of an interrupted cell ran out
            return "timeout", f"cell {index}'s output went on past its interruption", index
        except ValueError as err:
            if not _unreadable_message(err):
                raise
            why = str(err).partition(":")[0]  # the rest is the signature, different each run
            return ("crashed", f"the kernel sent a message in cell {index} that grading could not read ({why}): "
                    "it was broken or stopping, and its output may be cut short", index)
        except (DeadKernelError, RuntimeError) as err:
            stopped_for = getattr(self._sandboxed, "stopped_for", None)  # nbclient has let go of self.km
            if stopped_for:  # the sandbox's bounds on what it writes
                return "crashed", f"the kernel was stopped in cell {index}: {stopped_for}", index
            limit = self.memory_limit / 2**30
            # the kernel's folder is the student's to write: a regular file's last bytes, or nothing
            log = read_tail(self._scratch / "kernel.log", 4096).decode(errors="replace").strip().splitlines()
            last = f"; its last words: {log[-1][:200]}" if log else ""
            return ("crashed", f"the kernel died in cell {index} ({type(err).__name__}): it ran out of memory "
                    f"(limit {limit:g} GiB), was killed, or the code ended the process{last}", index)
        finally:
            self.timeout = per_cell
        return "graded", "", None

    def output(self, outs, msg, display_id, cell_index):
        """nbclient's output handling, with a budget of bytes per cell: what is past it is left out as it
        arrives (nbgrader's LimitOutput trims long text only after the whole notebook ran, and not a long
        line or an image), and one note per stream says how much. Errors are always kept (they decide a
        test cell), and so are the checks' values up to their own larger budget."""
        content, kind = msg.get("content", {}), msg.get("msg_type")
        if kind == "error":  # always kept, within a budget of its own: a message of 100 MB is a student's too
            return super().output(outs, {**msg, "content": bounded_error(content)}, display_id, cell_index)
        if not self.output_limit:
            return super().output(outs, msg, display_id, cell_index)
        data = content.get("data") or {}
        checked = any(mime in data for mime in self.kept_whole)
        size = len(content.get("text", "")) + sum(len(v) if isinstance(v, str) else len(json.dumps(v))
                                                  for v in data.values())
        used = self._output_bytes.get((cell_index, checked), 0)
        # the cell's budget, within what the notebook's other cells kept of theirs (a cleared cell's no longer counts)
        others = sum(v for (at, whole), v in self._kept_bytes.items() if whole == checked and at != cell_index)
        notebook_limit = self.check_output_limit if checked else self.notebook_output_limit
        limit = min(self.check_output_limit if checked else self.output_limit, max(0, notebook_limit - others))
        self._output_bytes[cell_index, checked] = used + size
        if used + size <= limit:
            self._kept_bytes[cell_index, checked] = self._kept_bytes.get((cell_index, checked), 0) + size
            return super().output(outs, msg, display_id, cell_index)
        name = content.get("name") if kind == "stream" else "stdout"
        left_out = self._left_out.setdefault((cell_index, name), [0, None])
        left_out[0] += size
        if kind == "stream" and used < limit:  # a stream's text up to the limit is kept: one print can be MBs
            kept = content["text"][:limit - used]
            left_out[0] -= len(kept)
            self._kept_bytes[cell_index, checked] = self._kept_bytes.get((cell_index, checked), 0) + len(kept)
            super().output(outs, {**msg, "content": {**content, "text": kept}}, display_id, cell_index)
        # the rest: one note per stream (stderr's own, so a cell whose stderr fails it still fails)
        note, at = left_out[1] or (None, 0)
        if not (at < len(outs) and outs[at] is note):  # none yet, or the cell was cleared since
            note, at = NotebookNode(output_type="stream", name=name, text=""), len(outs)
            outs.append(note)
            left_out[1] = note, at
        note.text = (f"[grading left out {left_out[0] / 2**20:,.1f} MiB of this cell's output past its first "
                     f"{limit / 2**20:g} MiB]\n")
        return None

    def preprocess_cell(self, cell, resources, index):
        try:
            return super().preprocess_cell(cell, resources, index)
        finally:
            self._notes_first(cell, index)

    def _notes_first(self, cell, index: int) -> None:
        """The cell's notes of what was left out go before its outputs once it ran: nbgrader's LimitOutput
        then keeps the first 1000 lines, the notes among them. Display ids that later cells may update
        follow their outputs to their new places."""
        notes = [entry[1][0] for (at, _), entry in self._left_out.items() if at == index and entry[1]]
        if not notes:
            return
        order = sorted(range(len(cell.outputs)), key=lambda n: not any(cell.outputs[n] is note for note in notes))
        if order == sorted(order):
            return
        moved = {old: new for new, old in enumerate(order)}
        cell.outputs = [cell.outputs[n] for n in order]
        for places in self._display_id_map.values():
            if index in places:
                places[index] = [moved.get(n, n) for n in places[index]]

    def clear_output(self, outs, msg, cell_index):
        """A cleared cell starts its budget again: a progress display that redraws itself keeps its last."""
        for checked in (False, True):
            self._output_bytes.pop((cell_index, checked), None)
            self._kept_bytes.pop((cell_index, checked), None)
        return super().clear_output(outs, msg, cell_index)

    def _watch_for_exit(self, cell, cell_index, execute_reply) -> None:
        """A cell that called exit() or quit() says so in its reply: grading stops right after this cell.
        The kernel does not stop itself (the startup file in ``sandbox.py``), so the cell is read to its end."""
        payloads = (execute_reply or {}).get("content", {}).get("payload", [])
        if any(p.get("source") == "ask_exit" and not p.get("keepkernel") for p in payloads):
            self._exit_asked = True

    def _timeout_reason(self, stopped_at: int | None) -> str:
        """The first cell that ran out of time. Which limit struck it, the cell's or the notebook's, depends on
        the machine's load when a notebook loops in several cells; which cell it was does not."""
        first = next((i for i, c in enumerate(self.nb.cells) if self._timed_out(c)), stopped_at)
        if stopped_at is not None:
            first = min(first, stopped_at)
        return (f"cell {first} ran past its time limit and was interrupted (limits: {self.timeout} s per cell, "
                f"{self.notebook_timeout} s for the whole notebook)")

    @staticmethod
    def _timed_out(cell) -> bool:
        return any(o.get("ename") in ("CellTimeoutError", "KeyboardInterrupt") for o in cell.get("outputs", []))

    def _mark_not_run(self, stopped_at: int, reason: str) -> None:
        for index, cell in enumerate(self.nb.cells[stopped_at:], start=stopped_at):
            if cell.cell_type != "code":
                continue
            if index == stopped_at:
                cell.outputs.append(_error("GradingStopped", reason))
            else:
                cell.outputs = [_error("NotRun", f"not run: {reason}")]


def _graded_calls(nb) -> list[tuple[str, int | None]]:
    """(exercise, seed) of every check the notebook's test cells make (their source is the instructor's)."""
    return [call for cell in nb.cells if cell.cell_type == "code" and cell.metadata.get("nbgrader", {}).get("grade")
            for call in check_calls(cell.source)]


def course_sandbox(checks_module: str, views_dir: str, cases_dir: str, assignment: str, nb,
                   forced_view: tuple[str, str] | None = None) -> tuple[str | None, dict]:
    """(the key of the view the notebook's kernel sees, what of its SandboxPolicy is the course's: the view's folder,
    the cases file and the variable naming it). The view is the one most of its test cells' checks are judged in
    (``JudgeChecks`` runs the notebook again for the others); (None, {}) for a course without views."""
    if not (views_dir and checks_module and assignment):
        return None, {}
    grading = importlib.import_module(checks_module)
    if not hasattr(grading, "views_of"):
        return None, {}
    if forced_view is None:
        keys = list(grading.views_of(_graded_calls(nb)).values())
        key = max(sorted(set(keys)), key=keys.count) if keys else grading.BARE
        forced_view = (key, str(Path(views_dir) / assignment / key))
    key, folder = forced_view
    cases = Path(cases_dir) / f"{assignment}.cases.json" if cases_dir else None
    if cases is None or not cases.exists():
        return key, {"view": folder}
    return key, {"view": folder, "cases": str(cases), "env": ((grading.GRADING_ENV, SandboxPolicy.cases_path),)}
