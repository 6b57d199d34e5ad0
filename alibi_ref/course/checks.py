"""The notebooks' checks: each exercise defined once, run in the student's kernel, judged outside it.

A test cell reads ``check("paper_slopes", paper_slopes)``. What happens depends on where it runs:

- In the student's own session (working through the notebook, or nbgrader's Validate), ``check``
  runs the answer on the exercise's cases and judges the results right there with ``judge``:
  one short message per failure, naming a classic mistake where the answer matches one.
- When the autograder grades (its sandbox sets ``GRADING_ENV``), ``check`` only runs the answer
  and hands the values back as one display output of MIME type ``MIME``: arrays as float64
  bytes with their dtype and device, never pickles. The grader's own process regenerates the
  cases, computes the expected values with the reference and calls the same ``judge``
  (``autograder.verdicts``). Nothing the answer does inside the kernel (patching numpy, this
  module or the profiler) can change a verdict: at most it changes the values handed back,
  and those must still be right for inputs it cannot know in advance.

Every comparison is in float64 and allows float32 rounding (``FLOAT32_SLACK``): a float32 answer
earns the points wherever a float64 one does. Cases marked ``exact`` allow nothing.

A downstream exercise (``Exercise.upstream``) is also run with the reference's version of the
student's earlier answers it calls, so that one mistake costs one exercise: the verdict says so.
"""

from __future__ import annotations

import base64
import functools
import math
import os
import pickle
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

MIME = "application/vnd.alibi-course.check+json"
GRADING_ENV = "ALIBI_COURSE_GRADING"
# |got - expected| may exceed a case's own tolerance by this much, relative to the largest
# expected magnitude (at least 1): float32's rounding after the few dozen operations of an exercise
FLOAT32_SLACK = 2e-5
MAX_CASE_BYTES = 16 * 2**20


# ----------------------------------------------------------------------------- what an exercise is

@dataclass(frozen=True)
class Case:
    """One call of the answer: ``label`` is what was called, as the student would write it."""

    label: str
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    expected: object = None  # a literal (the chapter's table), or None: the exercise's reference computes it
    atol: float = 1e-10
    rtol: float = 0.0
    exact: bool = False  # no float32 slack: the exercise is about exact values
    raises: str | None = None  # the answer must raise this exception (by name) instead of returning
    dtype: str | None = None  # the answer must come back in this dtype
    device: str | None = None  # tensor inputs go to this device ("meta": shapes only, no data)
    input_dtype: str | None = None  # tensor inputs in this dtype (default float64)
    pick: Callable | None = None  # applied to the answer's value in the kernel: the part this case checks


@dataclass(frozen=True)
class Mistake:
    """A classic wrong answer: ``variant`` computes it, with the reference's signature."""

    hint: str
    variant: Callable


@dataclass(frozen=True)
class Exercise:
    name: str
    visible: Callable[[], list[Case]]
    hidden: Callable[[np.random.Generator], list[Case]]
    reference: Callable
    mistakes: tuple[Mistake, ...] = ()
    upstream: tuple[str, ...] = ()  # the student's own earlier answers this one calls, by name
    torch_inputs: bool = False  # array arguments reach the answer as tensors (on the notebook's device)
    jax_inputs: bool = False  # array arguments reach the answer as JAX arrays (float32 unless input_dtype says)
    adapter: Callable | None = None  # kernel-side: (answer, *args, **kwargs) -> the value to hand back
    allowed: tuple[Callable, ...] = ()  # course helpers the notebook lets this answer use, reference inside and all


EXERCISES: dict[str, Exercise] = {}


def exercise(ex: Exercise) -> Exercise:
    if ex.name in EXERCISES:  # one name, one exercise: a second would silently replace the first's checks
        raise ValueError(f"two exercises are called {ex.name!r}")
    EXERCISES[ex.name] = ex
    return ex


def cases(name: str, seed: int | None) -> list[Case]:
    """The visible cases (``seed`` None) or the hidden ones drawn with ``seed``."""
    ex = _exercise(name)
    return ex.visible() if seed is None else ex.hidden(np.random.default_rng(seed))


def _exercise(name: str) -> Exercise:
    if not EXERCISES:
        from . import exercises  # noqa: F401  (registers every exercise)
    if name not in EXERCISES:
        raise KeyError(f"no exercise called {name!r}; known: {', '.join(sorted(EXERCISES))}")
    return EXERCISES[name]


# ----------------------------------------------------------------------------- values, as data

def encode(value, depth: int = 0):
    """``value`` as JSON-able data: arrays and tensors as float64 bytes with dtype and device."""
    if depth > 8:
        return {"other": "a structure nested too deep"}
    if value is None or isinstance(value, (bool, str)):
        return {"scalar": value}
    if isinstance(value, dict):
        return {"map": {str(k): encode(v, depth + 1) for k, v in list(value.items())[:64]}}
    if isinstance(value, (tuple, list)) and not all(isinstance(x, (int, float)) for x in value):
        return {"seq": [encode(v, depth + 1) for v in value[:64]]}
    kind, device, dtype = "array", "cpu", None
    if hasattr(value, "detach") and hasattr(value, "device"):  # a torch tensor
        kind, device, dtype = "tensor", str(value.device), str(value.dtype).removeprefix("torch.")
        if value.device.type == "meta":
            return {"tensor": None, "shape": list(value.shape), "dtype": dtype, "device": device}
        value = value.detach().cpu().double().numpy()
    try:
        array = np.array(value, copy=True, subok=False)
        dtype = dtype or str(array.dtype)
        array = array.astype(np.float64)
    except (TypeError, ValueError):
        return {"other": type(value).__name__}
    if array.nbytes > MAX_CASE_BYTES:
        return {"other": f"an array of {array.nbytes / 2**20:.0f} MiB"}
    return {kind: base64.b64encode(array.tobytes()).decode(), "shape": list(array.shape), "dtype": dtype,
            "device": device, "python": type(value).__name__ if kind == "array" else "Tensor"}


@dataclass(frozen=True)
class Leaf:
    """A handed-back array: its values as float64 and what it was."""

    values: np.ndarray | None  # None for a meta tensor
    shape: tuple
    dtype: str
    device: str
    kind: str  # "array" or "tensor"


def decode(data):
    """The inverse of ``encode``, for data that came from an untrusted kernel: malformed data raises ValueError."""
    if not isinstance(data, dict) or len(data) == 0:
        raise ValueError("not an encoded value")
    if "scalar" in data:
        if not isinstance(data["scalar"], (bool, str, type(None))):
            raise ValueError("bad scalar")
        return data["scalar"]
    if "map" in data:
        return {str(k): decode(v) for k, v in dict(data["map"]).items()}
    if "seq" in data:
        return tuple(decode(v) for v in list(data["seq"]))
    if "other" in data:
        return Other(str(data["other"]))
    kind = "tensor" if "tensor" in data else "array"
    shape = tuple(int(n) for n in data["shape"])
    if any(n < 0 for n in shape):
        raise ValueError("negative dimension")
    if kind == "tensor" and data["tensor"] is None:
        return Leaf(None, shape, str(data["dtype"]), str(data["device"]), kind)
    raw = base64.b64decode(data[kind], validate=True)
    if len(raw) != 8 * math.prod(shape):
        raise ValueError(f"{len(raw)} bytes for shape {shape}")
    values = np.frombuffer(raw, dtype=np.float64).reshape(shape).copy()
    return Leaf(values, shape, str(data["dtype"]), str(data["device"]), kind)


@dataclass(frozen=True)
class Other:
    what: str  # a value that is not numbers


# ----------------------------------------------------------------------------- the guard against the reference

# what the guard calls, taken at import: an answer may patch os, sys or threading (that is allowed, as
# nothing is judged in its kernel), and a patched os.path or sys.getprofile must not blind it
_abspath = os.path.abspath
_getprofile, _setprofile, _getframe = sys.getprofile, sys.setprofile, sys._getframe
_threads_getprofile, _threads_setprofile = threading.getprofile, threading.setprofile

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_INSIDE = _PACKAGE_DIR + os.sep
_COURSE = os.path.join(_PACKAGE_DIR, "course") + os.sep
_EXERCISES_FILE = _COURSE + "exercises.py"
_PARENT = os.path.dirname(_PACKAGE_DIR) + os.sep


def _absolute(filename: str) -> str:
    # a module's code carries the absolute path it was imported from: only str methods on that path,
    # which no answer can patch (os.path.abspath calls os.path functions an answer could)
    return filename if filename.startswith(_INSIDE) else _abspath(filename)


@functools.lru_cache(maxsize=4096)  # the guard asks for every Python call the answer makes
def is_reference_code(filename: str) -> bool:
    """One rule: the reference is alibi_ref outside alibi_ref.course, and the exercises' own references.

    The course's helpers (its example, plots, the chapter's interface, these checks) are for students;
    ``exercises`` holds a reference for every exercise, so it counts as the reference.
    """
    filename = _absolute(filename)
    return filename.startswith(_INSIDE) and (not filename.startswith(_COURSE) or filename == _EXERCISES_FILE)


# where installed code lives (the standard library, site-packages); frozen modules have "<frozen ...>"
_INSTALLED = tuple({os.path.join(os.path.realpath(p), "") for p in (sys.prefix, sys.base_prefix, sys.exec_prefix,
                                                                     sys.base_exec_prefix)})


@functools.lru_cache(maxsize=4096)
def is_answer_code(filename: str) -> bool:
    """Code neither alibi_ref's nor installed: a notebook's cells (the student's), or code they compiled."""
    filename = _absolute(filename)
    return not (filename.startswith(_INSIDE) or filename.startswith(_INSTALLED) or filename.startswith("<frozen "))


def _qualified_name(code) -> str:
    module = _absolute(code.co_filename).removeprefix(_PARENT).removesuffix(".py")
    return f"{module.replace(os.sep, '.')}.{code.co_name}"


SWITCHED_OFF = "the profiler was switched off while the answer ran (the guard against calling the reference)"
NESTED = "the answer started a guard of its own, which would hide its calls from the check's (the guard)"


def _lend(fn: Callable) -> Callable:
    """``fn`` (the reference's version of an upstream answer) as a function the guard can tell apart."""

    @functools.wraps(fn)
    def lent(*args, **kwargs):
        return fn(*args, **kwargs)

    return lent


_ANY_LENT = _lend(len)  # every lent function runs this one wrapper's code: trusting it trusts them all


class ReferenceGuard:
    """Records the first call into the reference made while active, however it was reached.

    A profile hook sees every Python-level call, in the answer's thread and in every thread started
    through ``threading`` while a guard runs. What runs inside a ``trusted`` function (a course
    helper the notebook allows, or what the check itself lent the answer: ``_lend``) is not counted;
    in another thread nothing is trusted. (Threads started before, or through ``_thread``, are not
    watched: the screen flags every use of those modules in an answer, autograder/screen.py.)
    """

    def __init__(self, trusted=(), excused=()):
        self.call: str | None = None
        self._trusted = {fn.__code__ for fn in trusted}
        self._excused = {fn.__code__ for fn in excused}  # the check's own code (a case's pick): not counted itself
        # per frame running now (innermost last): whether it runs on a trusted function's behalf. Trust passes
        # to what a trusted function calls, but not through the answer's own code: a trusted helper that calls
        # back into the answer (an int subclass's __lt__, an object's __array__) gives that code no trust
        self._trust: list[bool] = []

    def _hook(self, frame, event, arg):
        if event == "return":
            if self._trust:
                self._trust.pop()
            return
        if event != "call":
            return
        code = frame.f_code
        caller_trusted = bool(self._trust) and self._trust[-1]
        self._trust.append(code in self._trusted or (caller_trusted and not is_answer_code(code.co_filename)))
        if not caller_trusted and code not in self._trusted and code not in self._excused:
            self.count(code)

    def count(self, code, where: str = "") -> None:
        """Record ``code``'s call if it is the reference's and the first such call."""
        if code is _THREADS_SETPROFILE:  # the hook threads get, changed (and maybe put back) by the answer
            self.refuse(SWITCHED_OFF)
        elif self.call is None and is_reference_code(code.co_filename):
            self.call = _qualified_name(code) + where

    def refuse(self, why: str) -> None:
        """Record that the answer went around the guard, unless a reference call is already recorded."""
        if self.call is None:
            self.call = why

    def __enter__(self):
        for outer in _ACTIVE:  # no check runs inside another: only an answer starts a guard while one runs
            outer.refuse(NESTED)
        self._previous = _getprofile(), _threads_getprofile()
        _ACTIVE.append(self)
        _threads_setprofile(_in_other_thread)
        self._installed = _HOOK.__get__(self)  # the hook as defined here, even if the class was patched since
        _setprofile(self._installed)
        return self

    def __exit__(self, *exc):
        if self not in _ACTIVE:
            raise RuntimeError("this guard is not running: it was never entered or has exited already")
        if _getprofile() is not self._installed or _threads_getprofile() is not _in_other_thread:
            self.refuse(SWITCHED_OFF)
        _setprofile(self._previous[0])
        _threads_setprofile(self._previous[1])
        _ACTIVE.remove(self)
        return False


_HOOK = ReferenceGuard._hook
_ACTIVE: list[ReferenceGuard] = []  # the guards now running, innermost last
_THREADS_SETPROFILE = _threads_setprofile.__code__
# the code that may set the profile function while a guard runs: the guard itself, and a thread starting
# (threading hands it the hook the guard gave threading)
_SETTERS = {ReferenceGuard.__enter__.__code__, ReferenceGuard.__exit__.__code__,
            threading.Thread._bootstrap_inner.__code__}


def _audit(event: str, args) -> None:
    """Python's audit hook: sys.setprofile called while a guard runs, by anything but the guard or a
    thread's start, switches the guard off, even if the answer puts the hook back before the check ends.

    An audit event is raised however the call is reached (a computed getattr, map(), cProfile's enable
    from C), where the guard's own hook sees only calls made from Python. It looks at one event and
    returns at once for every other; Python keeps an audit hook for the life of the interpreter.
    """
    if event != "sys.setprofile" or not _ACTIVE:
        return
    try:
        setter = _getframe(1).f_code  # the Python code that called it (frame 0 is this hook)
    except ValueError:  # called from C with no Python frame at all: not the guard's
        setter = None
    if setter not in _SETTERS:
        for guard in _ACTIVE:
            guard.refuse(SWITCHED_OFF)


sys.addaudithook(_audit)


def _in_other_thread(frame, event, arg):
    """The hook of every thread started while a guard runs. It stays with the thread, so a thread an
    answer starts in one call and uses in the next reports to the guard running then."""
    if _ACTIVE and event == "call":
        _ACTIVE[-1].count(frame.f_code, " (in a thread the answer started)")


# ----------------------------------------------------------------------------- running the answer (in the kernel)

def _to_torch(x, device, dtype):
    import torch

    if isinstance(x, np.ndarray) and x.dtype.kind == "f":
        return torch.tensor(x, dtype=getattr(torch, dtype or "float64"), device=device)
    return x


def _to_jax(x, dtype):
    import jax.numpy as jnp

    if isinstance(x, np.ndarray) and x.dtype.kind == "f":
        return jnp.asarray(x, dtype=dtype or "float32")
    return x


def _call(answer: Callable, case: Case, ex: Exercise, device, lent: bool = False) -> dict:
    """One case in this kernel: the value (encoded) or the error, the device the inputs were on, any reference call."""
    args, kwargs, where = case.args, dict(case.kwargs), None
    if ex.torch_inputs:
        where = str(case.device or device or "cpu")
        args = tuple(_to_torch(a, where, case.input_dtype) for a in args)
        kwargs = {k: _to_torch(v, where, case.input_dtype) for k, v in kwargs.items()}
    elif ex.jax_inputs:
        args = tuple(_to_jax(a, case.input_dtype) for a in args)
        kwargs = {k: _to_jax(v, case.input_dtype) for k, v in kwargs.items()}
    # everything that can run the answer's code stays inside the guard: the call, and reading what came
    # back (a returned object's __array__, __getitem__ or __str__ is the answer's code too)
    trusted = ex.allowed + ((_ANY_LENT,) if lent else ())
    with ReferenceGuard(trusted, excused=(case.pick,) if case.pick is not None else ()) as guard:
        try:
            value = ex.adapter(answer, *args, **kwargs) if ex.adapter else answer(*args, **kwargs)
            result = {"value": encode(case.pick(value) if case.pick is not None else value)}
        except Exception as err:  # the answer's own error is a result like any other
            said = str(err)[:300]
            result = {"raised": f"{type(err).__name__}: {said}" if said else type(err).__name__}
    return {**result, "reference_call": guard.call, "device": where}


def _with_reference_upstream(answer: Callable, names: list[str]) -> Callable:
    """``answer`` run with the reference's version of each upstream answer it calls by name."""
    from .exercises import UPSTREAM

    namespace = answer.__globals__
    lent = {name: _lend(UPSTREAM[name]) for name in names}

    def rebound(*args, **kwargs):
        saved = {name: namespace[name] for name in names}
        namespace.update(lent)
        try:
            return answer(*args, **kwargs)
        finally:
            namespace.update(saved)

    return rebound


def run(name: str, answer, seed: int | None = None, device=None) -> dict:
    """Run ``answer`` (a function, or a dict of named values) on the exercise's cases: what the judge reads."""
    ex = _exercise(name)
    chosen = cases(name, seed)
    if any(case.device == "meta" for case in chosen):
        _warm_up_meta()
    call = answer if callable(answer) else functools.partial(_look_up, answer)
    payload = {"exercise": name, "seed": seed, "results": [_call(call, case, ex, device) for case in chosen]}
    upstream = [n for n in ex.upstream if callable(answer) and n in getattr(answer, "__globals__", {})]
    if upstream:
        rebound = _with_reference_upstream(answer, upstream)
        payload["upstream"] = upstream
        payload["with_reference_upstream"] = [_call(rebound, case, ex, device, lent=True) for case in chosen]
    return payload


def _warm_up_meta() -> None:
    """torch loads its meta-device kernels on first use (about a second, several under the guard's hook)."""
    import torch

    (torch.arange(3, device="meta")[:, None] - torch.ones(2, device="meta")).abs().masked_fill(
        torch.ones(3, 2, dtype=torch.bool, device="meta"), 0.0).softmax(-1)


def _look_up(values, *path):
    for key in path:
        values = values[key]
    return values


# ----------------------------------------------------------------------------- judging (grader or student's kernel)

@dataclass
class Verdict:
    passed: bool
    message: str


def judge(payload: dict) -> Verdict:
    """Compare a payload's results with the reference's. Raises ValueError for a malformed payload."""
    name, seed = payload["exercise"], payload["seed"]
    ex = _exercise(str(name))
    if seed is not None and not isinstance(seed, int):
        raise ValueError("bad seed")
    chosen = cases(ex.name, seed)
    results = list(payload["results"])
    if len(results) != len(chosen):
        raise ValueError(f"{len(results)} results for {len(chosen)} cases")
    where = "hidden" if seed is not None else "visible"
    passed = f"{len(chosen)} {where} check{'s pass' if len(chosen) != 1 else ' passes'}"
    expected = expected_values(ex.name, seed)
    failures = _failures(ex, chosen, results, expected)
    if not failures:
        return Verdict(True, f"{ex.name}: {passed}")
    rescued = payload.get("with_reference_upstream")
    if rescued is not None and len(rescued) == len(chosen) and not _failures(ex, chosen, list(rescued), expected):
        names = " and ".join(str(n) for n in payload.get("upstream", ()))
        return Verdict(True, f"{ex.name}: {passed} with a correct {names} in place of yours. Your {names} is wrong "
                             "(its own check says how); this exercise is right.")
    case, problem = failures[0]
    others = len(failures) - 1
    more = f" ({others} more {where} check{'s' * (others > 1)} failed too)" if others else ""
    hint = _name_the_mistake(ex, chosen, results)
    return Verdict(False, f"{case.label}: {problem}{more}" + (f"\nHint: {hint}" if hint else ""))


def _failures(ex: Exercise, chosen: list[Case], results: list, expected: list) -> list[tuple[Case, str]]:
    failures = []
    for case, result, value in zip(chosen, results, expected, strict=True):
        problem = _problem(ex, case, result, value)
        if problem:
            failures.append((case, problem))
    return failures


def expected_value(ex: Exercise, case: Case):
    return case.expected if case.expected is not None else ex.reference(*case.args, **case.kwargs)


# (exercise, seed) -> the reference's value for each of its cases (None where the case must raise)
_EXPECTED: dict[tuple[str, int | None], list] = {}


def expected_values(name: str, seed: int | None) -> list:
    """The reference's values for one check call's cases, computed once per process: a grader judges a
    whole class on the same cases, and some references (Flax's layers) take seconds. ``save_expected``
    computes them once for a course; ``load_expected`` lends them to the processes that judge."""
    if (name, seed) not in _EXPECTED:
        ex = _exercise(name)
        _EXPECTED[name, seed] = [None if case.raises else expected_value(ex, case) for case in cases(name, seed)]
    return _EXPECTED[name, seed]


def save_expected(path, calls) -> None:
    """Compute the values of every (exercise, seed) in ``calls`` and pickle them to ``path`` (the
    grader's own folder: a pickle is only read where it was written by the grader)."""
    values = {(name, seed): expected_values(name, seed) for name, seed in calls}
    with open(path, "wb") as f:
        pickle.dump(values, f)


def load_expected(path) -> None:
    with open(path, "rb") as f:
        _EXPECTED.update(pickle.load(f))


def _problem(ex: Exercise, case: Case, result, expected) -> str | None:
    if not isinstance(result, dict):
        raise ValueError("bad result")
    if result.get("reference_call") == SWITCHED_OFF:
        return f"{SWITCHED_OFF}: no points for this exercise"
    if result.get("reference_call"):
        return (f"calls {result['reference_call']} from the reference module: write it yourself "
                "(no points for this exercise)")
    if "raised" in result:
        if case.raises and str(result["raised"]).split(":")[0] == case.raises:
            return None
        return f"raised {str(result['raised'])[:300]}"
    if case.raises:
        return f"should raise {case.raises}, but returned a value"
    got = decode(result["value"])
    if ex.torch_inputs and isinstance(got, Leaf) and (got.kind != "tensor" or got.device != result.get("device")):
        return f"expected a tensor on {result.get('device')} (the inputs' device), got {_what(got)} on {got.device}"
    return compare(got, expected, case)


def compare(got, expected, case: Case, path: str = "") -> str | None:
    """What is wrong with ``got`` (decoded), or None. ``path`` names the part inside a tuple or dict."""
    at = f"{path}: " if path else ""
    if isinstance(expected, dict):
        if not isinstance(got, dict):
            return f"{at}expected a dict with keys {sorted(expected)}, got {_what(got)}"
        if sorted(got) != sorted(expected):
            return f"{at}expected the keys {sorted(expected)}, got {sorted(got)}"
        for key in sorted(expected):
            problem = compare(got[key], expected[key], case, f"{path}[{key!r}]")
            if problem:
                return problem
        return None
    if isinstance(expected, tuple):
        if not isinstance(got, tuple) or len(got) != len(expected):
            return f"{at}expected {len(expected)} values (a tuple), got {_what(got)}"
        for n, (g, e) in enumerate(zip(got, expected, strict=True)):
            problem = compare(g, e, case, f"{path}[{n}]")
            if problem:
                return problem
        return None
    if isinstance(expected, str):
        return None if got == expected else f"{at}expected {expected!r}, got {_what(got)}"
    if isinstance(expected, Expect):
        return expected.check(got, case, at)
    if isinstance(got, Leaf) and got.values is None:
        return f"{at}a tensor on the meta device has no values to compare"
    if not isinstance(got, Leaf):
        return f"{at}expected numbers, got {_what(got)}"
    if case.dtype and got.dtype != case.dtype:
        return f"{at}expected dtype {case.dtype}, got {got.dtype}"
    return compare_arrays(got.values, _as_float64(expected), case, at)


def _as_float64(x) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().cpu().double().numpy()
    return np.array(x, dtype=np.float64)


def compare_arrays(got: np.ndarray, expected: np.ndarray, case: Case, at: str = "") -> str | None:
    if got.shape != expected.shape:
        return f"{at}expected shape {expected.shape}, got {got.shape}"
    finite = np.isfinite(expected)
    misplaced = (np.isfinite(got) != finite) | (~finite & ~np.isnan(expected) & (got != expected))
    if misplaced.any():
        index = tuple(int(i) for i in np.argwhere(misplaced)[0])
        return (f"{at}at {index} expected {_number(expected[index])}, got {_number(got[index])} "
                f"(infinities and nans must sit where expected: {int(misplaced.sum())} entries differ)")
    diff = np.where(finite, np.abs(got - np.where(finite, expected, 0.0)), 0.0)
    scale = max(1.0, float(np.abs(expected[finite]).max())) if finite.any() else 1.0
    slack = 0.0 if case.exact else FLOAT32_SLACK * scale
    allowed = case.atol + case.rtol * np.abs(np.where(finite, expected, 0.0)) + slack
    wrong = diff > allowed
    if not wrong.any():
        return None
    order = np.argsort(-(diff - allowed), axis=None)[: min(3, int(wrong.sum()))]
    worst = [tuple(int(i) for i in np.unravel_index(k, diff.shape)) for k in order]
    shown = "; ".join(f"{f'{list(i)} ' if i else ''}expected {_number(expected[i])}, got {_number(got[i])}"
                      for i in worst)
    return f"{at}{int(wrong.sum())} of {diff.size} entries are off. Worst: {shown}"


def _number(x) -> str:
    return f"{float(x):.6g}"


def _what(x) -> str:
    if isinstance(x, Leaf):
        return f"{'a tensor' if x.kind == 'tensor' else 'an array'} of shape {x.shape}"
    if isinstance(x, Other):
        return x.what
    if isinstance(x, tuple):
        return f"a tuple of {len(x)}"
    return repr(x)[:80]


class Expect:
    """An expectation that is not a value: subclasses say what they check."""

    def check(self, got, case: Case, at: str) -> str | None:  # pragma: no cover - abstract
        raise NotImplementedError


def _name_the_mistake(ex: Exercise, chosen: list[Case], results: list) -> str | None:
    """The hint of the first classic mistake that reproduces every handed-back value."""
    usable = [(c, r) for c, r in zip(chosen, results, strict=True)
              if isinstance(r, dict) and "value" in r and c.expected is None and not c.raises]
    if not usable:
        return None
    for mistake in ex.mistakes:
        try:
            with np.errstate(all="ignore"):  # the mistakes overflow as the answers did
                if all(compare(decode(r["value"]), mistake.variant(*c.args, **c.kwargs), c) is None
                       for c, r in usable):
                    return mistake.hint
        except Exception:  # a variant that does not apply to these cases names nothing
            continue
    return None


# ----------------------------------------------------------------------------- the test cells' entry point

class CheckFailed(AssertionError):
    pass


def check(name: str, answer=None, /, *, hidden: int | None = None, device=None, **values) -> None:
    """Run the answer (a function, or named values) on the exercise's cases: judge here, or hand back to the grader.

    ``hidden``: the seed of the hidden cases (only in the instructor's hidden tests). ``device``: where
    tensor inputs go, for the exercises that take tensors.
    """
    __tracebackhide__ = True  # IPython shows the verdict, not this function's insides
    if answer is None:
        answer = values
    payload = run(name, answer, hidden, device)
    if os.environ.get(GRADING_ENV):
        from IPython.display import display

        display({MIME: payload, "text/plain": f"[{name}: results handed to the grader]"}, raw=True)
        return
    verdict = judge(payload)
    if not verdict.passed:
        raise CheckFailed(verdict.message)
    print(verdict.message)

