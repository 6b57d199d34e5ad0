"""The course's layer: what the chapter and its notebooks use on top of the library.

    examples   the chapter's shared example, "The cat sat on mat"
    chapter    ``multi_head_alibi``, the chapter's (N, d_model) interface
    explain    the chapter's per-query trace
    plots      drawing functions and widgets shared by the notebooks and scripts
    checks     what the notebooks' test cells call: run the answer, judge it here or in the grader
    exercises  every autograded exercise: its cases, its reference, the classic mistakes it names
    harness    how a check calls answers that are not plain functions (kernel side)

It imports the library (``alibi_ref``) and the lab (``alibi_ref.lab``); neither imports it.
"""

from . import checks, examples, exercises, harness, plots
from .chapter import multi_head_alibi
from .examples import cat_sat_on_mat
from .explain import explain

checks.guard(exercises, harness)  # once every exercise is registered, before any cell of a notebook runs

__all__ = ["cat_sat_on_mat", "checks", "examples", "explain", "multi_head_alibi", "plots"]
