"""The course's layer: what the chapter and its notebooks use on top of the library.

    examples   the chapter's shared example, "The cat sat on mat"
    chapter    ``multi_head_alibi``, the chapter's (N, d_model) interface
    explain    the chapter's per-query trace
    plots      drawing functions and widgets shared by the notebooks and scripts
    checks     what the notebooks' test cells call: run the answer, judge it here or hand it to the grader
    wire       what crosses between the grader and a graded kernel, as data
    model      what an exercise is; exercises: every autograded one, its cases, reference and mistakes
    judge      the values handed back against the reference's
    upstream   the reference's earlier answers, lent to a later exercise
    harness    how a check calls answers that are not plain functions (kernel side)
    view       what a graded kernel sees of the package; grading: the autograder's entry point

It imports the library (``alibi_ref``) and the lab (``alibi_ref.lab``); neither imports it.
"""

from . import checks, examples, exercises, harness, plots
from .chapter import multi_head_alibi
from .examples import cat_sat_on_mat
from .explain import explain

__all__ = ["cat_sat_on_mat", "checks", "examples", "exercises", "explain", "harness", "multi_head_alibi", "plots"]
