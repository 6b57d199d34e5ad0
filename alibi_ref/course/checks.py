"""What the notebooks' test cells call: ``check("paper_slopes", paper_slopes)`` runs the answer on the exercise's cases.

Where it runs decides the rest:

- In the student's own session (working through the notebook, or nbgrader's Validate), the cases
  come from ``exercises`` and ``judge`` compares the values right there: one short message per
  failure, naming a classic mistake where the answer matches one.
- When the autograder grades, the kernel sees only what its notebook's answers may use
  (``view.py``): not the reference, not ``exercises``, not the judge. The cases' inputs come from
  the grader as data (``wire.GRADING_ENV`` names the file, hidden ones drawn with a secret the
  kernel never holds), and ``check`` only hands the values back as one display output
  (``wire.MIME``), which the grader judges in its own process (``grading.py``). There is nothing in
  the kernel to reach for and nothing in it to trust: values computed some other way must still
  be right on inputs only the grader chose.

A downstream exercise (``Exercise.upstream``) is also run with the reference's version of the
earlier answers it calls, where those are at hand (``upstream.py``): so one mistake costs one exercise.
"""

from __future__ import annotations

import functools
import json
import linecache
import os
import site
import sys
import sysconfig
import traceback
from collections.abc import Callable

from . import harness
from .wire import GRADING_ENV, MIME, call_key, encode, unpack


class CheckFailed(AssertionError):
    def _render_traceback_(self) -> list[str]:
        """What IPython shows for a failed check: the verdict, which names the case and the mistake, and none of
        this module's frames (IPython keeps the frame that raised whatever ``__tracebackhide__`` says)."""
        return [f"CheckFailed: {self}"]


def check(name: str, answer=None, /, *, hidden: int | None = None, device=None, **values) -> None:
    """Run the answer (a function, or named values) on the exercise's cases: judge here, or hand back to the grader.

    ``hidden``: the seed of the hidden cases (only in the instructor's hidden tests). ``device``: where
    tensor inputs go, for the exercises that take tensors.
    """
    __tracebackhide__ = True  # IPython shows the verdict, not this function's insides
    payload = run(name, answer if answer is not None else values, hidden, device)
    if os.environ.get(GRADING_ENV):
        from IPython.display import display

        display({MIME: payload, "text/plain": f"[{name}: results handed to the grader]"}, raw=True)
        return
    from .judge import judge

    verdict = judge(payload)
    if not verdict.passed:
        raise CheckFailed(verdict.message)
    print(verdict.message)


def _library_roots() -> tuple[str, ...]:
    """alibi_ref (or the graded kernel's view of it), the standard library and every folder of installed packages,
    each ending in a separator (so that /usr is not /usr2); never the root itself."""
    roots = {os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}
    roots |= {sysconfig.get_paths()[key] for key in ("stdlib", "platstdlib", "purelib", "platlib")}
    roots |= {p for p in sys.path if os.path.basename(p.rstrip(os.sep)) in ("site-packages", "dist-packages")}
    roots.add(site.getusersitepackages())
    return tuple(os.path.abspath(r).rstrip(os.sep) + os.sep for r in roots if r and os.path.abspath(r) != os.sep)


_LIBRARIES = _library_roots()


def _is_library(filename: str) -> bool:
    return filename.startswith("<") or os.path.abspath(filename).startswith(_LIBRARIES)


def _your_line(tb) -> str | None:
    """Where the answer's own code was when it raised: the innermost frame outside alibi_ref and the installed
    packages (a notebook cell, or a script of the student's), as "in name, line n: source"."""
    yours = [(frame.f_code, line) for frame, line in traceback.walk_tb(tb) if not _is_library(frame.f_code.co_filename)]
    if not yours:
        return None
    code, line = yours[-1]
    text = linecache.getline(code.co_filename, line).strip()
    return f"in {code.co_name}, line {line}" + (f": {text[:120]}" if text else "")


def run(name: str, answer, seed: int | None = None, device=None) -> dict:
    """Run ``answer`` (a function, or a dict of named values) on one check call's cases: what the judge reads."""
    spec = _cases(name, seed)
    chosen = spec["cases"]
    if any(case["device"] == "meta" for case in chosen):
        _warm_up_meta()
    call = answer if callable(answer) else functools.partial(_look_up, answer)
    payload = {"exercise": name, "seed": None if seed is None else int(seed),
               "results": [_call(call, case, spec, device) for case in chosen]}
    lent = _lent(spec["upstream"], answer)
    if lent and not os.environ.get(GRADING_ENV):
        lent = _failing_their_own_checks(lent, answer, payload, device)
    if lent:
        rebound = _with_reference_upstream(answer, lent)
        payload["upstream"] = sorted(lent)
        payload["with_reference_upstream"] = [_call(rebound, case, spec, device) for case in chosen]
    return payload


def _cases(name: str, seed: int | None) -> dict:
    """One check call's cases as data (``model.kernel_cases``): from the grader's file when grading, else drawn here."""
    where = os.environ.get(GRADING_ENV)
    if not where:
        from . import exercises  # noqa: F401  (registers every exercise)
        from .model import kernel_cases

        return json.loads(json.dumps(kernel_cases(name, seed)))  # the same data a graded kernel reads
    prepared = _grader_cases(where)
    if call_key(name, seed) not in prepared:
        raise KeyError(f"check({name!r}, hidden={seed}): the grader prepared no such check (the test cells are the "
                       "instructor's; a call written elsewhere is not graded)")
    return prepared[call_key(name, seed)]


@functools.lru_cache(maxsize=1)
def _grader_cases(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _lent(names: list[str], answer) -> dict[str, Callable]:
    """The reference's version of each upstream answer this one calls by name, where the kernel has it."""
    try:
        from .upstream import LENT
    except ImportError:  # a graded kernel's view holds none, or only those a rescue run lends
        return {}
    return {n: LENT[n] for n in names if n in LENT and callable(answer) and n in getattr(answer, "__globals__", {})}


def _failing_their_own_checks(lent: dict[str, Callable], answer: Callable, payload: dict, device) -> dict:
    """In the student's session, of the upstream answers ``lent`` would replace, those whose own visible checks
    fail, and none where this answer passes as it is: as the grader lends only upstream answers that failed, a
    correct piece is never blamed and an exercise that grading fails is never called right."""
    from .judge import judge

    if judge(payload).passed:
        return {}
    failing = {}
    for name, reference in lent.items():
        try:
            passed = judge(run(name, answer.__globals__[name], device=device)).passed
        except Exception:  # theirs cannot even be run on its own cases: it fails its check
            passed = False
        if not passed:
            failing[name] = reference
    return failing


def _with_reference_upstream(answer: Callable, lent: dict[str, Callable]) -> Callable:
    """``answer`` run with the reference's version of each upstream answer it calls by name."""
    namespace = answer.__globals__

    def rebound(*args, **kwargs):
        saved = {name: namespace[name] for name in lent}
        namespace.update(lent)
        try:
            return answer(*args, **kwargs)
        finally:
            namespace.update(saved)

    return rebound


def _call(answer: Callable, case: dict, spec: dict, device) -> dict:
    """One case: the value (encoded) or the error, and the device the inputs were on."""
    # each call unpacks inputs of its own: an answer that changes its inputs in place (`x -= x.max()`) must not
    # change the next case's
    args, kwargs, where = unpack(case["args"]), unpack(case["kwargs"]), None
    if spec["torch_inputs"]:
        where = str(case["device"] or device or "cpu")
        args = tuple(_to_torch(a, where, case["input_dtype"]) for a in args)
        kwargs = {k: _to_torch(v, where, case["input_dtype"]) for k, v in kwargs.items()}
    elif spec["jax_inputs"]:
        args = tuple(_to_jax(a, case["input_dtype"]) for a in args)
        kwargs = {k: _to_jax(v, case["input_dtype"]) for k, v in kwargs.items()}
    adapter = getattr(harness, spec["adapter"]) if spec["adapter"] else None
    pick = getattr(harness, case["pick"]) if case["pick"] else None
    try:
        value = adapter(answer, *args, **kwargs) if adapter else answer(*args, **kwargs)
        return {"value": encode(pick(value) if pick else value), "device": where}
    except Exception as err:  # the answer's own error is a result like any other
        said = str(err)[:300]
        return {"raised": f"{type(err).__name__}: {said}" if said else type(err).__name__, "device": where,
                "at": _your_line(err.__traceback__)}


def _to_torch(x, device, dtype):
    import numpy as np
    import torch

    if isinstance(x, np.ndarray) and x.dtype.kind == "f":
        return torch.tensor(x, dtype=getattr(torch, dtype or "float64"), device=device)
    return x


def _to_jax(x, dtype):
    import jax.numpy as jnp
    import numpy as np

    if isinstance(x, np.ndarray) and x.dtype.kind == "f":
        return jnp.asarray(x, dtype=dtype or "float32")
    return x


def _warm_up_meta() -> None:
    """torch loads its meta-device kernels on first use (about a second): before the cases, not inside one."""
    import torch

    (torch.arange(3, device="meta")[:, None] - torch.ones(2, device="meta")).abs().masked_fill(
        torch.ones(3, 2, dtype=torch.bool, device="meta"), 0.0).softmax(-1)


def _look_up(values, *path):
    for key in path:
        values = values[key]
    return values
