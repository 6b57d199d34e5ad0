"""Helpers for the notebooks' test cells: readable comparisons and a guard against answers that
just call the reference.

Everything is compared as a plain float64 NumPy array (a copy, never a subclass and never a
tensor), with np.testing, so an object that overrides ``==`` or ``__array_ufunc__`` cannot
make a wrong answer look right.
"""

from __future__ import annotations

import contextlib
import os
import sys

import numpy as np

_COURSE_DIR = os.path.dirname(os.path.abspath(__file__))
_PACKAGE_DIR = os.path.dirname(_COURSE_DIR)


def is_reference_code(filename: str) -> bool:
    """One rule: the reference is alibi_ref's library and lab, every module outside alibi_ref.course.

    The course's own helpers (its example, plots, these checks) are there for students to use.
    """
    filename = os.path.abspath(filename)
    return filename.startswith(_PACKAGE_DIR + os.sep) and not filename.startswith(_COURSE_DIR + os.sep)


def _qualified_name(code) -> str:
    module = os.path.relpath(os.path.abspath(code.co_filename), os.path.dirname(_PACKAGE_DIR))[:-3]
    return f"{module.replace(os.sep, '.')}.{code.co_name}"


def as_float64(x, name: str = "your answer") -> np.ndarray:
    """``x`` (array, tensor, list or number) as a new plain float64 ndarray, or a readable error."""
    if x is None:
        raise AssertionError(f"{name} is None: did the function forget to return its result?")
    if hasattr(x, "detach"):  # a torch tensor, on any device
        x = x.detach().cpu().double().numpy()
    try:
        return np.array(x, dtype=np.float64, copy=True, subok=False)
    except (TypeError, ValueError) as err:
        raise AssertionError(f"{name} should be numbers (an array), got {type(x).__name__}: {err}") from None


def assert_close(actual, expected, *, atol: float, rtol: float = 0.0, name: str = "your answer") -> None:
    """Shape, then values (-inf and nan where expected), with the largest difference in the message."""
    actual, expected = as_float64(actual, name), as_float64(expected, "the expected value")
    if actual.shape != expected.shape:
        raise AssertionError(f"{name} has shape {actual.shape}, expected {expected.shape}")
    finite = np.isfinite(expected)
    if not np.array_equal(np.isfinite(actual), finite) or not np.array_equal(actual[~finite], expected[~finite],
                                                                               equal_nan=True):
        where = np.argwhere((np.isfinite(actual) != finite) | ((~finite) & (actual != expected)))[0]
        raise AssertionError(
            f"{name}: at index {tuple(int(i) for i in where)} expected {expected[tuple(where)]}, "
            f"got {actual[tuple(where)]} (infinities and nans must sit where expected)"
        )
    diff = np.abs(np.where(finite, actual, 0.0) - np.where(finite, expected, 0.0))
    worst = np.unravel_index(np.argmax(diff), diff.shape) if diff.size else ()
    with np.printoptions(precision=4, suppress=True, linewidth=100):
        np.testing.assert_allclose(
            actual, expected, atol=atol, rtol=rtol,
            err_msg=(f"{name}: largest difference {diff[worst] if diff.size else 0:.3g} at index "
                     f"{tuple(int(i) for i in worst)}\nexpected:\n{expected}\ngot:\n{actual}"),
        )


@contextlib.contextmanager
def forbid_reference(what: str = "this answer"):
    """Fail if code run inside calls into alibi_ref's own implementation (slopes, bias, attention...).

    A profile hook sees every Python-level call, however the function was imported.
    """
    calls: list[str] = []

    def hook(frame, event, arg):
        if event == "call" and not calls and is_reference_code(frame.f_code.co_filename):
            calls.append(_qualified_name(frame.f_code))

    previous = sys.getprofile()
    sys.setprofile(hook)
    try:
        yield
    finally:
        sys.setprofile(previous)
    if calls:
        raise AssertionError(
            f"{what} calls {calls[0]} from the reference module: write it yourself (no points for this part)"
        )
