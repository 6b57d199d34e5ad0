"""nbgrader's Validate, screened as grading screens: the test cells the screen flags fail with grading's reason.

The students' ``nbgrader_config.py`` calls ``screen_in_validate``; Validate then says before a student hands in
what grading will say of an answer that reaches for the reference or imports a module grading will not hand over.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from .collect import modules_for_validate
from .screen import flagged_test_cells, imported_modules, screen_notebook


def _validate_failures(nb, resources: dict) -> dict:
    """{test cell's index: the error output Validate gives it}: the screen's flags, as grading gives them, and,
    where the notebook imports a module of the student's that grading will not hand it (too large, the
    standard library's name, ...), every test cell, saying so: there the import fails."""
    import nbformat

    from .verdicts import error_output

    # the modules beside the notebook, which its kernel imports from its folder, as grading will hand them
    folder = Path(resources.get("metadata", {}).get("path") or ".")
    sources, not_handed_over = modules_for_validate(nbformat.writes(nb).encode(), folder)

    def shown_whole(ename: str, evalue: str):
        error = error_output(ename, evalue)
        error.traceback = textwrap.wrap(error.traceback[0], 80)  # Validate's report cuts each line at 87 characters
        return error

    failures = {index: shown_whole("Flagged", why)
                for index, why in flagged_test_cells(nb, screen_notebook(nb, imported_modules(nb, sources))).items()}
    if not_handed_over:
        for index, cell in enumerate(nb.cells):
            if cell.cell_type == "code" and cell.metadata.get("nbgrader", {}).get("grade") and index not in failures:
                failures[index] = shown_whole("NotHandedOver", f"when graded, this notebook {not_handed_over}")
    return failures


def screen_in_validate() -> None:
    """Make nbgrader's Validate fail the test cells the screen flags, as grading will.

    Called from the students' nbgrader_config.py. nbgrader's Execute, which Validate runs, uses nbclient's
    ``on_cell_executed`` hook as a method of its own (to record errors), and Validate's list of
    preprocessors is not configurable, so the method is wrapped: after nbgrader's own, a flagged test
    cell gets the Flagged error the autograder gives it, and every test cell of a notebook that imports a
    module grading will not hand over gets NotHandedOver (``_validate_failures``). Wrapping twice is a no-op.
    """
    from nbgrader.preprocessors import Execute

    recorded = Execute.on_cell_executed
    if getattr(recorded, "screens", False):
        return

    def on_cell_executed(self, **kwargs):
        recorded(self, **kwargs)
        if getattr(self, "_screened", (None,))[0] is not self.nb:
            self._screened = self.nb, _validate_failures(self.nb, (getattr(self, "resources", None) or {}))
        error = self._screened[1].get(kwargs["cell_index"])
        if error:
            kwargs["cell"].outputs.append(error)

    on_cell_executed.screens = True
    Execute.on_cell_executed = on_cell_executed
