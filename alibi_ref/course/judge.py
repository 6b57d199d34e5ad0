"""Judging: the values a check handed back against the reference's, in the grader's process or a student's session.

Every comparison is in float64 and allows float32 rounding (``FLOAT32_SLACK``): a float32 answer
earns the points wherever a float64 one does. Cases marked ``exact`` allow nothing. A failure
names a classic mistake (``Exercise.mistakes``) only where the answer ran on every case and the
mistake reproduces every value.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass

import numpy as np

from .model import Case, Exercise, cases, find
from .wire import Leaf, Other, decode, encode

# |got - expected| may exceed a case's own tolerance by this much, relative to the largest
# expected magnitude (at least 1): float32's rounding after the few dozen operations of an exercise
FLOAT32_SLACK = 2e-5


@dataclass
class Verdict:
    passed: bool
    message: str


def judge(payload: dict, secret: bytes | None = None, *, rescue: bool = False, peak_rise: int | None = None) -> Verdict:
    """Compare a payload's results with the reference's (``secret``: the grader's, with which it drew the hidden
    cases). ``rescue``: judge only the results made with the reference's upstream answers (a rescue run's).
    ``peak_rise``: bytes the grader measured the sandbox's memory rising while the check's cell ran, judged in place
    of the peak the kernel reports (``Exercise.peak_from_grader``). Raises ValueError for a malformed payload."""
    name, seed = payload["exercise"], payload["seed"]
    ex = find(str(name))
    if seed is not None and not isinstance(seed, int):
        raise ValueError("bad seed")
    chosen = cases(ex.name, seed, secret)
    where = "hidden" if seed is not None else "visible"
    passed = f"{len(chosen)} {where} check{'s pass' if len(chosen) != 1 else ' passes'}"
    expected = expected_values(ex.name, seed, secret)
    rescued = payload.get("with_reference_upstream")
    if rescue and rescued is None:
        raise ValueError("no results made with the reference's upstream answers")
    results = list(rescued if rescue else payload["results"])
    if len(results) != len(chosen):
        raise ValueError(f"{len(results)} results for {len(chosen)} cases")
    if ex.peak_from_grader and peak_rise is not None:
        results = [_with_peak(result, peak_rise) for result in results]
    failures = _failures(ex, chosen, results, expected)
    names = [str(n) for n in payload.get("upstream", ())]
    upstream, fails = " and ".join(names), "fail their own checks" if len(names) > 1 else "fails its own check"
    # results made with the reference's upstream exist only for upstream answers that failed their own checks
    rescued_passes = f"{ex.name}: {passed} with a correct {upstream} in place of yours. Your {upstream} {fails} " \
                     f"(which say{'s' * (len(names) == 1)} how); this exercise is right."
    if not failures:
        return Verdict(True, rescued_passes if rescue else f"{ex.name}: {passed}")
    if not rescue and rescued is not None and len(rescued) == len(chosen) and not _failures(
            ex, chosen, list(rescued), expected):
        return Verdict(True, rescued_passes)
    case, problem = failures[0]
    others = len(failures) - 1
    more = f" ({others} more {where} check{'s' * (others > 1)} failed too)" if others else ""
    hint = _name_the_mistake(ex, chosen, results)
    return Verdict(False, f"{case.label}: {problem}{more}" + (f"\nHint: {hint}" if hint else ""))


def _with_peak(result, peak: int):
    """A (peak, output) result with ``peak`` in place of the peak the kernel reported."""
    value = result.get("value") if isinstance(result, dict) else None
    if not isinstance(value, dict) or not isinstance(value.get("seq"), list) or len(value["seq"]) != 2:
        return result  # raised, or not a pair: judged as it came
    return {**result, "value": {"seq": [encode(float(peak)), value["seq"][1]]}}


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
_EXPECTED: dict[tuple[str, int | None, bytes | None], list] = {}


def expected_values(name: str, seed: int | None, secret: bytes | None = None) -> list:
    """The reference's values for one check call's cases, computed once per process: a grader judges a
    whole class on the same cases, and some references (Flax's layers) take seconds. ``save_expected``
    computes them once for a course; ``load_expected`` lends them to the processes that judge."""
    if (name, seed, secret) not in _EXPECTED:
        ex = find(name)
        _EXPECTED[name, seed, secret] = [None if case.raises else expected_value(ex, case)
                                         for case in cases(name, seed, secret)]
    return _EXPECTED[name, seed, secret]


def save_expected(path, calls, secret: bytes | None = None) -> None:
    """Compute the values of every (exercise, seed) in ``calls`` (hidden ones drawn with ``secret``) and
    pickle them to ``path`` (the grader's own folder: a pickle is only read where the grader wrote it)."""
    values = {(name, seed, secret): expected_values(name, seed, secret) for name, seed in calls}
    with open(path, "wb") as f:
        pickle.dump(values, f)


def load_expected(path) -> None:
    with open(path, "rb") as f:
        _EXPECTED.update(pickle.load(f))


# why an answer that is right on the CPU raises on the meta device, where a mistake cannot be named (it ran on
# no value): the two ways a function ties itself to one device or to values
ON_META = ("\nHint: a tensor on the meta device has a shape and no values: your function reads values (.tolist(), "
           ".item(), .numpy(), a loop over a tensor) or makes a tensor on a fixed device (device='cpu'); build from "
           "the inputs' device and shapes (torch.arange(n, device=slopes.device))")


def _problem(ex: Exercise, case: Case, result, expected) -> str | None:
    if not isinstance(result, dict):
        raise ValueError("bad result")
    if "raised" in result:
        if case.raises and str(result["raised"]).split(":")[0] == case.raises:
            return None
        if result["raised"] == "NotImplementedError":  # what the answer cell's stub raises
            return ("raised NotImplementedError, as the answer cell does before it is answered: not answered yet "
                    "(an answer written in another cell is replaced when the answer cell runs after it)")
        at = result.get("at")  # where in the student's own code, as the kernel saw it
        return (f"raised {str(result['raised'])[:300]}" + (f" ({at[:200]})" if isinstance(at, str) and at else "")
                + (ON_META if case.device == "meta" else ""))
    if case.raises:
        return f"should raise {case.raises}, but returned a value"
    got = decode(result["value"])
    if not isinstance(expected, (tuple, dict, str)):
        got = _as_one_array(got)
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
        names = case.parts if not path and len(case.parts) == len(expected) else ()
        for n, (g, e) in enumerate(zip(got, expected, strict=True)):
            problem = compare(g, e, case, names[n] if names else f"{path}[{n}]")
            if problem:
                return problem
        return None
    if isinstance(expected, str):
        return None if got == expected else f"{at}expected {expected!r}, got {_what(got)}"
    got = _as_one_array(got)
    if isinstance(expected, Expect):
        return expected.check(got, case, at)
    if isinstance(got, Leaf) and got.values is None:
        return f"{at}a tensor on the meta device has no values to compare"
    if not isinstance(got, Leaf):
        wanted = f"an array of shape {tuple(np.shape(expected))}" if np.ndim(expected) else "a number"
        ragged = " that do not make one array of numbers" if isinstance(got, tuple) else ""
        return f"{at}expected {wanted}, got {_what(got)}{ragged}"
    if case.dtype and got.dtype != case.dtype:
        return f"{at}expected dtype {case.dtype}, got {got.dtype}"
    return compare_arrays(got.values, _as_float64(expected), case, at)


def _as_one_array(got):
    """Where an array is expected, a sequence of numbers is one (nested lists, a list of numpy scalars or of
    tensors), as ``np.asarray`` and ``assert_allclose`` read it: one Leaf if its items are arrays of one shape,
    else ``got`` as it came. A tuple of several results is never read this way: the judge compares it item by
    item, since ``expected`` says what each is."""
    if not isinstance(got, tuple) or not got:
        return got
    parts = [_as_one_array(x) for x in got]
    if not all(isinstance(p, Leaf) and p.values is not None for p in parts) or len({p.shape for p in parts}) > 1:
        return got

    def common(values: set[str], mixed: str) -> str:
        return values.pop() if len(values) == 1 else mixed

    return Leaf(np.stack([p.values for p in parts]), (len(parts), *parts[0].shape),
                common({p.dtype for p in parts}, "mixed"), common({p.device for p in parts}, "mixed"),
                common({p.kind for p in parts}, "array"))


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
        stand_in = expected[index] == -np.inf and np.isfinite(got[index]) and got[index] <= -1e4
        why = ("a large negative number stands in for -inf: masked entries must be -inf itself, as asked"
               if stand_in else "infinities and nans must sit where expected")
        return (f"{at}at {index} expected {_number(expected[index])}, got {_number(got[index])} "
                f"({why}: {int(misplaced.sum())} entries differ)")
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
        inner = _first_other(x)  # what the wire could not carry says more than the list around it
        return f"a list or tuple of {len(x)} items" + (f", in it {inner.what}" if inner else "")
    return repr(x)[:80]


def _first_other(x):
    if isinstance(x, Other):
        return x
    return next((o for o in map(_first_other, x) if o), None) if isinstance(x, tuple) else None


class Expect:
    """An expectation that is not a value: subclasses say what they check."""

    def check(self, got, case: Case, at: str) -> str | None:  # pragma: no cover - abstract
        raise NotImplementedError


def _name_the_mistake(ex: Exercise, chosen: list[Case], results: list) -> str | None:
    """The hint of the first classic mistake that reproduces every handed-back value, where the answer returned a
    value on every case it was asked to (a case that raised says nothing of which mistake it is)."""
    if any(not (isinstance(r, dict) and "value" in r) for c, r in zip(chosen, results, strict=True) if not c.raises):
        return None
    usable = [(c, r) for c, r in zip(chosen, results, strict=True)  # a value the chapter gave names nothing
              if c.expected is None and not c.raises]
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
