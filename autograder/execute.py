"""nbgrader's Execute step, run in the sandbox, and never letting one notebook sink the others.

nbgrader's own Execute raises when a kernel dies, and nbgrader then discards the student's
whole submission, passing cells included. This one records what happened instead:

- a cell that dies (the kernel crashed, ran out of memory or exited) or runs past the
  notebook's time limit gets an error output saying so, and every cell after it a
  "not run" error, so those test cells score 0 while the cells before keep their points;
- answer cells flagged by the static screen (``screen.py``) fail every test cell after them;
- the outcome (status, reason, seconds) goes to a small JSON file per notebook, from which
  the grade table is written.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path

from nbclient.client import NotebookClient
from nbclient.exceptions import CellTimeoutError, DeadKernelError
from nbformat import NotebookNode
from nbgrader.preprocessors import Execute
from traitlets import Bool, Integer, Unicode

from .sandbox import SandboxedKernelManager, SandboxPolicy
from .screen import screen_notebook


class NotebookTimeout(Exception):
    pass


def _error(ename: str, evalue: str) -> NotebookNode:
    return NotebookNode(output_type="error", ename=ename, evalue=evalue, traceback=[f"{ename}: {evalue}"])


class SandboxedExecute(Execute):
    notebook_timeout = Integer(120, help="Seconds for the whole notebook, all cells together").tag(config=True)
    memory_limit = Integer(3 * 2**30, help="Bytes of address space for the kernel").tag(config=True)
    use_bwrap = Bool(True, help="Sandbox the kernel with bubblewrap").tag(config=True)
    state_dir = Unicode("", help="Where each notebook's outcome is written as JSON").tag(config=True)

    def create_kernel_manager(self):
        self.km = SandboxedKernelManager(policy=self._policy, scratch=self._scratch)
        return self.km

    def preprocess(self, nb, resources, km=None):
        ids = resources["nbgrader"]
        findings = screen_notebook(nb)
        self._policy = SandboxPolicy(memory_bytes=self.memory_limit,
                                     use_bwrap=self.use_bwrap)
        self._scratch = Path(tempfile.mkdtemp(prefix="alibi-kernel-"))
        # the assignment's data files (nbgrader copied the instructor's versions next to the notebook)
        folder = Path(resources.get("metadata", {}).get("path") or ".")
        for data in folder.iterdir() if folder.is_dir() else ():
            if data.is_file() and data.suffix != ".ipynb":
                shutil.copy(data, self._scratch / data.name)
        start = time.monotonic()
        status, reason, stopped_at = "graded", "", None
        NotebookClient.__init__(self, nb, None)
        self.reset_execution_trackers()
        self._check_assign_resources(resources)
        try:
            status, reason, stopped_at = self._run_cells(resources, start + self.notebook_timeout)
        finally:
            shutil.rmtree(self._scratch, ignore_errors=True)
        if stopped_at is not None:
            self._mark_not_run(stopped_at, reason)
        if findings:
            self._fail_tests_after_flags(findings)
            status, reason = "flagged", "; ".join(str(f) for f in findings)
        if status == "graded" and any(self._timed_out(c) for c in self.nb.cells):
            status, reason = "timeout", f"a cell ran past the {self.timeout} s limit per cell and was interrupted"
        self._write_state(ids, status, reason, time.monotonic() - start)
        return self.nb, self.resources

    def _run_cells(self, resources, deadline):
        per_cell = self.timeout
        index = 0
        try:
            with self.setup_kernel():
                self.wait_for_reply(self.kc.kernel_info())
                for index, cell in enumerate(self.nb.cells):
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise NotebookTimeout
                    self.timeout = max(1, min(per_cell, int(remaining)))
                    self.preprocess_cell(cell, resources, index)
        except NotebookTimeout:
            return "timeout", f"the notebook ran past its {self.notebook_timeout} s limit (at cell {index})", index
        except (DeadKernelError, CellTimeoutError, RuntimeError) as err:
            limit = self.memory_limit / 2**30
            log = (self._scratch / "kernel.log").read_text(errors="replace").strip().splitlines()
            last = f"; its last words: {log[-1][:200]}" if log else ""
            return ("crashed", f"the kernel died in cell {index} ({type(err).__name__}): it ran out of memory "
                    f"(limit {limit:g} GiB), was killed, or the code ended the process{last}", index)
        finally:
            self.timeout = per_cell
        return "graded", "", None

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

    def _fail_tests_after_flags(self, findings) -> None:
        flagged = {f.cell for f in findings}
        seen_flag = False
        for cell in self.nb.cells:
            meta = cell.metadata.get("nbgrader", {})
            seen_flag = seen_flag or meta.get("grade_id") in flagged
            if seen_flag and meta.get("grade") and cell.cell_type == "code":
                reasons = "; ".join(str(f) for f in findings)
                cell.outputs.append(_error("Flagged", f"no points: an answer reaches into the grader ({reasons})"))

    def _write_state(self, ids, status: str, reason: str, seconds: float) -> None:
        if not self.state_dir:
            return
        path = Path(self.state_dir) / ids["student"] / f"{ids['notebook']}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        failed = {}
        for cell in self.nb.cells:
            meta = cell.metadata.get("nbgrader", {})
            errors = [o.ename for o in cell.get("outputs", []) if o.output_type == "error"]
            if meta.get("grade") and cell.cell_type == "code" and errors:
                failed[meta["grade_id"]] = errors[0]
        path.write_text(json.dumps({"status": status, "reason": reason, "failed": failed,
                                    "seconds": round(seconds, 2)}))
