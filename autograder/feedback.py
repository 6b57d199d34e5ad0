"""Feedback that never shows a hidden test: not its source (nbgrader's ClearHiddenTests removes
that) and not the traceback lines that would quote it (``ScrubHiddenTestTracebacks`` keeps only
the error's name and message); and no HTML of a student's that could run in a browser."""

from nbconvert.filters.markdown_mistune import markdown2html_mistune
from nbconvert.preprocessors.sanitize import SanitizeHTML
from nbgrader.preprocessors import NbGraderPreprocessor
from traitlets import Any, Bool, List, Unicode


class ScrubHiddenTestTracebacks(NbGraderPreprocessor):
    begin_test_delimeter = Unicode("BEGIN HIDDEN TESTS").tag(config=True)

    def preprocess_cell(self, cell, resources, index):
        if cell.cell_type == "code" and self.begin_test_delimeter in cell.source:
            for output in cell.get("outputs", []):
                if output.output_type == "error":
                    output.traceback = [f"{output.ename}: {output.evalue}"]
        return cell, resources


# what bleach keeps of HTML in outputs, written answers and the course's text: its own safe tags, the course's hints
# (<details>), and layout; never a script, a handler or a style
SAFE_TAGS = sorted({"a", "abbr", "acronym", "b", "blockquote", "br", "code", "details", "div", "em", "h1", "h2", "h3",
                    "h4", "h5", "h6", "hr", "i", "img", "kbd", "li", "ol", "p", "pre", "span", "strong", "sub",
                    "summary", "sup", "table", "tbody", "td", "th", "thead", "tr", "ul"})
SAFE_ATTRIBUTES = {"a": ["href", "title"], "abbr": ["title"], "acronym": ["title"],
                   "img": ["src", "alt", "width", "height"], "td": ["colspan", "rowspan"], "th": ["colspan", "rowspan"]}


class SanitizeStudentHTML(SanitizeHTML):
    """nbconvert's SanitizeHTML (bleach) over what a student wrote or made: every code cell's outputs, and the
    markdown and raw cells that are not the course's locked ones (which nbgrader restores from its gradebook, and
    whose math bleach would garble). In the autograded notebook that formgrader shows, and in the feedback.

    Markdown is rendered to HTML first (nbconvert's own renderer), then cleaned: bleach reads HTML, and a
    markdown link to ``javascript:`` is no tag until rendered, where nbconvert's renderer keeps its target."""

    enabled = Bool(True, help="nbconvert's preprocessors are off unless enabled; this one is the grader's").tag(
        config=True)
    tags = List(Unicode(), default_value=SAFE_TAGS, help="HTML tags kept").tag(config=True)
    attributes = Any(default_value=SAFE_ATTRIBUTES, help="HTML attributes kept, by tag").tag(config=True)

    def preprocess_cell(self, cell, resources, index):
        if cell.cell_type != "code" and cell.metadata.get("nbgrader", {}).get("locked"):
            return cell, resources
        if cell.cell_type == "markdown":
            cell.source = self.sanitize_html_tags(markdown2html_mistune(cell.source))
            return cell, resources
        return super().preprocess_cell(cell, resources, index)

    def sanitize_code_outputs(self, outputs):
        for output in outputs:
            data = output.get("data") or {}
            if "text/markdown" in data:
                markdown = data.pop("text/markdown")
                data.setdefault("text/html", markdown2html_mistune(markdown))
        return super().sanitize_code_outputs(outputs)
