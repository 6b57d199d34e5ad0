"""Feedback that never shows a hidden test: not its source (nbgrader's ClearHiddenTests removes
that) and not the traceback lines that would quote it (this preprocessor keeps only the error's
name and message)."""

from nbgrader.preprocessors import NbGraderPreprocessor
from traitlets import Unicode


class ScrubHiddenTestTracebacks(NbGraderPreprocessor):
    begin_test_delimeter = Unicode("BEGIN HIDDEN TESTS").tag(config=True)

    def preprocess_cell(self, cell, resources, index):
        if cell.cell_type == "code" and self.begin_test_delimeter in cell.source:
            for output in cell.get("outputs", []):
                if output.output_type == "error":
                    output.traceback = [f"{output.ename}: {output.evalue}"]
        return cell, resources
