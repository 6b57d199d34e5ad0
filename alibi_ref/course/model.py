"""What an exercise is: its cases, its reference, the classic mistakes it names, what its answer may call.

``exercises`` defines every exercise of the course with these; the grader (``grading``) and a
student's own session (``checks``) read them. A graded kernel never imports this module: it gets
the cases' inputs from the grader as data (``kernel_cases``, ``wire.pack``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .wire import call_key, pack


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
    pick: str | None = None  # a function of ``harness``, applied to the answer's value in the kernel
    parts: tuple[str, ...] = ()  # the names of a tuple answer's items, as the prompt calls them (else [0], [1], ...)


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
    reference: Callable | None
    mistakes: tuple[Mistake, ...] = ()
    upstream: tuple[str, ...] = ()  # the student's own earlier answers this one calls, by name (``upstream.py``)
    torch_inputs: bool = False  # array arguments reach the answer as tensors (on the notebook's device)
    jax_inputs: bool = False  # array arguments reach the answer as JAX arrays (float32 unless input_dtype says)
    adapter: Callable | None = None  # a function of ``harness``: (answer, *args, **kwargs) -> the value handed back
    helpers: tuple[str, ...] = ()  # course helpers the notebook lets this answer use (``view.HELPERS``)
    # its value is (peak memory in bytes, output): where the grader measured how far the sandbox's memory rose while
    # the check's cell ran (``judge``'s ``peak_rise``), that is the peak judged, not what the kernel said
    peak_from_grader: bool = False


EXERCISES: dict[str, Exercise] = {}


def exercise(ex: Exercise) -> Exercise:
    if ex.name in EXERCISES:  # one name, one exercise: a second would silently replace the first's checks
        raise ValueError(f"two exercises are called {ex.name!r}")
    EXERCISES[ex.name] = ex
    return ex


def find(name: str) -> Exercise:
    if name not in EXERCISES:  # exercises.py registers every exercise
        raise KeyError(f"no exercise called {name!r}; known: {', '.join(sorted(EXERCISES))}")
    return EXERCISES[name]


def cases(name: str, seed: int | None, secret: bytes | None = None) -> list[Case]:
    """The visible cases (``seed`` None) or the hidden ones drawn with ``seed`` and, when grading, the
    grader's ``secret``: a seed in a notebook's source is known before grading, the secret is not."""
    ex = find(name)
    if seed is None:
        return ex.visible()
    return ex.hidden(np.random.default_rng(seed if secret is None else [seed, int.from_bytes(secret, "little")]))


def kernel_cases(name: str, seed: int | None, secret: bytes | None = None) -> dict:
    """What the kernel needs to run one check call, as data (``wire.pack``): how the answer is called and each
    case's inputs. Nothing of the reference, the expected values or the mistakes."""
    ex = find(name)
    return {"exercise": name, "seed": seed, "torch_inputs": ex.torch_inputs, "jax_inputs": ex.jax_inputs,
            "adapter": ex.adapter.__name__ if ex.adapter else None, "upstream": list(ex.upstream),
            "cases": [{"label": c.label, "args": pack(tuple(c.args)), "kwargs": pack(dict(c.kwargs)),
                       "device": c.device, "input_dtype": c.input_dtype, "pick": c.pick}
                      for c in cases(name, seed, secret)]}


def kernel_cases_file(calls, secret: bytes | None = None) -> dict:
    """The cases file for ``calls`` ((exercise, seed) pairs): what a graded kernel reads (``GRADING_ENV``)."""
    return {call_key(name, seed): kernel_cases(name, seed, secret) for name, seed in calls}
