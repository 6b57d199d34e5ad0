"""A notebook that ran out of time is graded again, alone, with limits scaled to what the instructor's solution
takes at that moment: a busy machine costs time, never points.

Time limits stop runaway code, and they are wall-clock limits: on a machine with other work, honest code
runs slower, and a limit that is generous when the machine is idle strikes it. So when a student's notebook
ran out of time, the grader runs the instructor's source notebook (solutions and hidden tests) for it in a
sandbox of its own once the student's is gone (nothing the student left running slows it), timing each cell,
and grades the student's notebook once more with limits of at least ``MARGIN`` times what the solution took
just now: per cell, the solution's slowest cell, and for the whole notebook, the solution's total; never below
the limits the grader was given. On an idle machine these are the limits given, and a notebook that loops
runs out of time again; on a machine ten times slower they are ten times longer, and an honest notebook
finishes. There is no ceiling: any ceiling is a load past which honest notebooks lose their points. What a
loop costs is bounded all the same, by the solution's time, which the student cannot stretch (the solution
runs after every process of theirs is gone). Only timeouts pay for this.
"""

from __future__ import annotations

import math
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import nbformat
from jupyter_core.utils import run_sync
from nbclient import NotebookClient

from . import outcomes
from .sandbox import SandboxedKernelManager, SandboxPolicy, new_scratch

MARGIN = 3  # the solution's time now, times this: what an honest answer may take


@dataclass(frozen=True)
class Limits:
    cell: int  # seconds per cell
    notebook: int  # seconds for the whole notebook


def solution_seconds(source: Path, policy: SandboxPolicy, cell_timeout: int) -> tuple[float, float]:
    """(the slowest cell, all cells) in seconds, for the instructor's notebook ``source`` run now in the sandbox,
    with the assignment's data files beside it."""
    nb = nbformat.read(source, as_version=4)
    scratch = new_scratch("kernel")
    for data in source.parent.iterdir():
        if data.is_file() and data.suffix != ".ipynb":
            shutil.copy(data, scratch / data.name)
    started: dict[int, float] = {}
    took: list[float] = []
    km = SandboxedKernelManager(policy=policy, scratch=scratch)
    client = NotebookClient(nb, km=km, timeout=cell_timeout * MARGIN * 4, allow_errors=True)
    client.on_cell_execute = lambda cell, cell_index: started.__setitem__(cell_index, time.monotonic())
    client.on_cell_executed = lambda cell, cell_index, execute_reply: took.append(
        time.monotonic() - started.get(cell_index, time.monotonic()))
    begun = time.monotonic()
    try:
        client.execute()
    finally:
        if km.has_kernel:
            run_sync(km.shutdown_kernel)(now=True)
        shutil.rmtree(scratch, ignore_errors=True)
    return max(took, default=0.0), time.monotonic() - begun


def scaled_limits(given: Limits, slowest_cell: float, total: float) -> Limits:
    def scaled(limit: int, seconds: float) -> int:
        return max(limit, math.ceil(MARGIN * seconds))

    return Limits(cell=scaled(given.cell, slowest_cell), notebook=scaled(given.notebook, total))


def timed_out(folder: Path) -> list[str]:
    """The notebooks of one student's assignment (its ``outcomes.assignment_dir``) that ran out of time."""
    return [name for name in outcomes.notebooks(folder)
            if outcomes.read(folder / f"{name}.json").get("status") == "timeout"]


def note_retry(outcome_file: Path, limits: Limits) -> None:
    """Say in the notebook's outcome that it was graded again, and under which limits, where it then finished."""
    outcome = outcomes.read(outcome_file)
    if outcome.get("status") in (None, "timeout"):
        return
    note = (f"graded again on its own after running out of time on a busy machine (limits then: {limits.cell} s "
            f"per cell, {limits.notebook} s for the whole notebook)")
    outcome["reason"] = "; ".join(part for part in (note, outcome.get("reason", "")) if part)
    outcomes.write(outcome_file, outcome)
