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
  and those must still be right for inputs it cannot know in advance. The hidden checks' values
  are signed where ``run`` makes them (``_signature``, keyed from the grader's secret), so a value
  changed on its way out of the check (the display path is the kernel's, any cell may rebind it)
  is refused by the judge.

Every comparison is in float64 and allows float32 rounding (``FLOAT32_SLACK``): a float32 answer
earns the points wherever a float64 one does. Cases marked ``exact`` allow nothing.

A downstream exercise (``Exercise.upstream``) is also run with the reference's version of the
student's earlier answers it calls, so that one mistake costs one exercise: the verdict says so.
"""

from __future__ import annotations

import _imp
import _signal
import _thread
import base64
import contextlib
import functools
import hmac
import json
import math
import os
import pathlib
import pickle
import signal
import sys
import sysconfig
import threading
import types
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

# what signs the hidden checks' values (run, _signature): C functions, taken now, which no cell can rebind
try:
    from _hashlib import hmac_digest as _hmac_digest
except ImportError:  # a Python built without OpenSSL: the standard library's own
    _hmac_digest = hmac.digest
try:
    from _json import encode_basestring_ascii as _json_string
except ImportError:
    _json_string = json.encoder.encode_basestring_ascii

MIME = "application/vnd.alibi-course.check+json"
GRADING_ENV = "ALIBI_COURSE_GRADING"
# |got - expected| may exceed a case's own tolerance by this much, relative to the largest
# expected magnitude (at least 1): float32's rounding after the few dozen operations of an exercise
FLOAT32_SLACK = 2e-5
MAX_CASE_BYTES = 16 * 2**20
MAX_SEQUENCE = 4096  # items in a list or tuple handed back (nested lists where an array was asked for included)


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
# the reference's own version of each earlier answer a later exercise calls (``Exercise.upstream``), lent in its
# place to run a downstream answer with the reference upstream (``_with_reference_upstream``); exercises.py fills it
UPSTREAM: dict[str, Callable] = {}


def exercise(ex: Exercise) -> Exercise:
    if ex.name in EXERCISES:  # one name, one exercise: a second would silently replace the first's checks
        raise ValueError(f"two exercises are called {ex.name!r}")
    EXERCISES[ex.name] = ex
    return ex


def cases(name: str, seed: int | None, secret: bytes | None = None) -> list[Case]:
    """The visible cases (``seed`` None) or the hidden ones drawn with ``seed`` and, when grading, the
    grader's ``secret``: a seed in a notebook's source is visible to the kernel's code before its check
    runs (and a small one can be guessed), the secret is not."""
    ex = _exercise(name)
    if seed is None:
        return ex.visible()
    return ex.hidden(np.random.default_rng(seed if secret is None else [seed, int.from_bytes(secret, "little")]))


def _exercise(name: str) -> Exercise:
    if name not in EXERCISES:  # exercises.py registers every exercise; alibi_ref.course imports it
        raise KeyError(f"no exercise called {name!r}; known: {', '.join(sorted(EXERCISES))}")
    return EXERCISES[name]


# ----------------------------------------------------------------------------- values, as data

def encode(value, depth: int = 0):
    """``value`` as JSON-able data: arrays and tensors as float64 bytes with dtype and device."""
    if depth > 8:
        return {"other": "a structure nested too deep"}
    if value is None or isinstance(value, bool):
        return {"scalar": value}
    if isinstance(value, str):  # a str of its own (a subclass's methods are the answer's code): see _canonical
        return {"scalar": str.__str__(value)}
    if isinstance(value, dict):
        return {"map": {str(k): encode(v, depth + 1) for k, v in list(value.items())[:64]}}
    if isinstance(value, (tuple, list)) and not all(isinstance(x, (int, float)) for x in value):
        if len(value) > MAX_SEQUENCE:  # not cut short: a shortened list would be judged as if it were the answer
            return {"other": f"a sequence of {len(value)} items (at most {MAX_SEQUENCE}: return an array)"}
        return {"seq": [encode(v, depth + 1) for v in value]}
    kind, device, dtype = "array", "cpu", None
    if hasattr(value, "detach") and hasattr(value, "device"):  # a torch tensor
        kind, device, dtype = "tensor", str(value.device), str(value.dtype).removeprefix("torch.")
        if value.device.type == "meta":
            return {"tensor": None, "shape": [int(n) for n in value.shape], "dtype": dtype, "device": device}
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
_getprofile, _setprofile, _getframe = sys.getprofile, sys.setprofile, sys._getframe
_threads_getprofile, _threads_setprofile = threading.getprofile, threading.setprofile
# the real functions behind those grading replaces (``_REPLACED``): only the audit hook keeps them once it has
_REAL_FUNCTIONS = {"start_new_thread": _thread.start_new_thread, "create_builtin": _imp.create_builtin,
                   "signal": _signal.signal, "raise_signal": _signal.raise_signal,
                   "interrupt_main": _thread.interrupt_main}

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_INSIDE = _PACKAGE_DIR + os.sep
_COURSE = os.path.join(_PACKAGE_DIR, "course") + os.sep
_EXERCISES_FILE = _COURSE + "exercises.py"
_PARENT = os.path.dirname(_PACKAGE_DIR) + os.sep
_PACKAGE_NAME = os.path.basename(_PACKAGE_DIR)  # a reference call is recorded by its qualified name


# where installed code lives (the standard library, site-packages); frozen modules have "<frozen ...>"
_INSTALLED = tuple({os.path.join(os.path.realpath(p), "") for p in (sys.prefix, sys.base_prefix, sys.exec_prefix,
                                                                     sys.base_exec_prefix)})


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

    Python's profiler reports every Python-level call, in the answer's thread and in every thread
    started through ``threading`` while a guard runs; when grading, in every thread started since
    grading began, however it was started (``_start_thread``). What runs inside a ``trusted`` function
    (a course helper the notebook allows, or what the check itself lent the answer: ``_lend``) is not
    counted; in another thread nothing is trusted. (In a student's own session, threads started
    before the check are not watched: nothing is graded there.)

    The guard holds nothing an answer could change to blind it: the profile functions are C all the way
    (``sys.audit`` bound to an event's name) and what they report, the guard's settings and its record
    live in Python's audit hook (``_audit_hook``), which no name reaches. ``call`` is read from there
    when the guard exits.
    """

    def __init__(self, trusted=(), excused=()):
        self.call: str | None = None
        self._trusted = frozenset(fn.__code__ for fn in trusted)
        self._excused = frozenset(fn.__code__ for fn in excused)  # the check's own code (a case's pick)

    def refuse(self, why: str) -> None:
        """Record that the answer went around the guard, unless something is recorded already."""
        _audit(_RECORD, self._token, why)

    def __enter__(self):
        given = []
        _audit(_ENTER, given, self._trusted, self._excused)  # a secret name; a guard running is refused (NESTED)
        self._token = given[0]
        self._previous = _getprofile(), _threads_getprofile()
        _threads_setprofile(_THREAD_PROFILE)
        _setprofile(_PROFILE)
        return self

    def __exit__(self, *exc):
        if not hasattr(self, "_token"):
            raise RuntimeError("this guard is not running: it was never entered")
        if _getprofile() is not _PROFILE or _threads_getprofile() is not _THREAD_PROFILE:
            self.refuse(SWITCHED_OFF)
        recorded = []
        _audit(_EXIT, self._token, recorded)  # raises if this guard is not running (it has exited already)
        _setprofile(self._previous[0])
        _threads_setprofile(self._previous[1])
        self.call = recorded[0]
        return False


_audit = sys.audit
# the guards' own audit events: the profile functions' reports, and what the audit hook keeps for a guard
_PROFILE_EVENT, _THREAD_EVENT = "alibi_ref.guard.profile", "alibi_ref.guard.thread"
_ENTER, _RECORD, _EXIT = "alibi_ref.guard.enter", "alibi_ref.guard.record", "alibi_ref.guard.exit"
# a replaced function asking the hook for the real one's work; a refusal handed to the hook that raises it
_REAL, _PENDING = "alibi_ref.guard.real", "alibi_ref.guard.pending"
_DRAW = "alibi_ref.guard.draw"  # run() asking for the grader's secret, once per hidden check
SECRET_BYTES = 32  # GRADING_ENV holds the grader's secret as hex, or "1" (grading with none: hidden seeds alone)
# the profile functions, for the answer's thread and the threads it starts: sys.audit with the event's name
# bound, no Python code, no state, nothing to patch
_PROFILE, _THREAD_PROFILE = types.MethodType(sys.audit, _PROFILE_EVENT), types.MethodType(sys.audit, _THREAD_EVENT)

# Python's audit events that an answer's own code raises only on a way around the guard (the answer's code
# called the function that raises it), and what each says it did: code that walks frames or objects, code
# built at run time (a copy of the reference under another name) and other processes are out of its sight
_REACH_EVENTS = {
    **dict.fromkeys(["sys._getframe", "sys._current_frames"], "walked the interpreter's frames"),
    **dict.fromkeys(["gc.get_objects", "gc.get_referrers", "gc.get_referents"], "walked the interpreter's objects"),
    **dict.fromkeys(["exec", "compile", "code.__new__", "function.__new__", "marshal.loads"],
                    "ran code built at run time"),
}
# "object.__getattr__" and "object.__setattr__" are raised for these attributes only (the others raise nothing)
_REACH_ATTRIBUTES = {**dict.fromkeys(["tb_frame", "gi_frame", "cr_frame", "ag_frame"],
                                     "walked the interpreter's frames"),
                     "__code__": "read or replaced a function's code"}
# starting a process is asked of every caller, not the first outside the standard library: installed code runs
# commands for whoever calls it (IPython's `!cmd` and `getoutput`, pexpect, setuptools' spawn), and an answer
# that had one run the reference in another process earned full marks
_PROCESS_EVENTS = frozenset(["subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
                             "os.forkpty", "pty.spawn"])
# what no installed code does on an answer's behalf, asked of the first caller outside the standard library
# (os.popen starts subprocess.Popen, a thread's run() can add an audit hook), and ctypes' events
_REACHED_THROUGH_STDLIB = {
    **dict.fromkeys(sorted(_PROCESS_EVENTS), "ran code in another process"),
    "sys.addaudithook": "added an audit hook, which sees the guard's own events",
    "sys.setprofile": "switched the profiler off",
    "cpython.PyInterpreterState_New": "ran code in another interpreter, which has no guard",
    **dict.fromkeys(["os.kill", "os.killpg", "signal.pthread_kill"], "sent a signal"),
}
_STDLIB = (os.path.join(os.path.realpath(sysconfig.get_paths()["stdlib"]), ""), "<frozen ")  # not site-packages


def _start_thread(function, args, kwargs=None):
    """``_thread.start_new_thread`` when grading: the thread runs under the guard's thread profile from
    its first call. Python 3.11 cannot profile a thread from another one, and a thread started before
    a check (an earlier cell's pool) would run the reference unseen while the answer waits for it.
    The audit hook starts the thread; this function holds no way to the real start."""
    done = []
    _audit(_REAL, done, "start_new_thread", (function, args, kwargs))
    return done[0]


def _create_builtin_module(spec):
    """``_imp.create_builtin`` when grading, which makes no fresh copy of a module whose functions grading
    replaced (``_thread``, ``_imp``, ``_signal``): the copy would hold the real ones."""
    done = []
    _audit(_REAL, done, "create_builtin", (spec.name,))
    return done[0]


def _set_signal_handler(signalnum, handler):
    """``_signal.signal`` when grading: no handler of the answer's own, which could raise an exception in
    the middle of the audit hook (its frame, and with it the guards' state, would go with the exception)."""
    done = []
    _audit(_REAL, done, "signal", (int(signalnum), int(handler) if isinstance(handler, int) else handler))
    return done[0]


def _raise_signal(signalnum):
    """``signal.raise_signal`` when grading: not for the answer (a KeyboardInterrupt raised in the hook)."""
    done = []
    _audit(_REAL, done, "raise_signal", (int(signalnum),))
    return done[0]


def _interrupt_main(signum=signal.SIGINT):
    """``_thread.interrupt_main`` when grading: not for the answer, as ``_raise_signal``."""
    done = []
    _audit(_REAL, done, "interrupt_main", (int(signum),))
    return done[0]


# what grading replaces, for good: (module, its namespace, name, replacement)
_REPLACED = [("_thread", vars(_thread), "start_new_thread", _start_thread),
             ("_thread", vars(_thread), "start_new", _start_thread),
             ("threading", vars(threading), "_start_new_thread", _start_thread),
             ("_imp", vars(_imp), "create_builtin", _create_builtin_module),
             ("_signal", vars(_signal), "signal", _set_signal_handler),
             ("_signal", vars(_signal), "raise_signal", _raise_signal),
             ("signal", vars(signal), "raise_signal", _raise_signal),
             ("_thread", vars(_thread), "interrupt_main", _interrupt_main)]


def _cell_runners() -> list:
    """The code of IPython's ``run_code``, which runs a cell's code (none where IPython is not installed)."""
    try:
        from IPython.core.interactiveshell import InteractiveShell
    except ImportError:
        return []
    return [InteractiveShell.run_code.__code__]


def _refuser(candidates: frozenset, attributes: frozenset) -> Callable:
    """The second audit hook: raises the refusal the first one decided on, for the events it can refuse.
    The first never lets an exception out (its frame would go with it, and the frame holds the guards'
    state); this one holds nothing but the names below."""
    audit, ask = sys.audit, _PENDING

    def refuse(event: str, args) -> None:
        if event in candidates or event[:7] == "ctypes." or (
                event[:7] == "object." and len(args) > 1 and type(args[1]) is str and args[1] in attributes):
            refusal = []
            audit(ask, refusal)
            if refusal:
                kind, message = refusal[0]
                raise kind(message)

    return refuse


# a copy of the reference is the reference: its code, whatever file it was loaded from (the package copied under
# another name and imported: a frame's file name alone missed it, full marks for every exercise). Code an honest
# answer could be by chance is left out: short code (a comprehension, FlexAttention's textbook `causal`) and
# mid-sized code without a docstring (the exercises' four-line `softmax`); a docstring is only ever copied
_SMALLEST_COPY, _SMALLEST_UNDOCUMENTED_COPY = 64, 160  # bytes of bytecode


def _fingerprint(code) -> tuple:
    """What a function's code is, apart from where it came from: its bytecode, names and constants (nested code
    by its own fingerprint), without its file name, line numbers or docstring (a copy with every docstring
    touched is the same code). Only exact built-in types are read."""
    consts = tuple(_fingerprint(c) if type(c) is types.CodeType else (type(c), c) for c in code.co_consts)
    if consts and consts[0][0] is str:  # a function's first constant is its docstring (or None)
        consts = ((str, None), *consts[1:])
    return (code.co_name, code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount, code.co_varnames,
            code.co_names, code.co_code, consts)


def _reference_fingerprints() -> dict[tuple, str]:
    """fingerprint -> qualified name, for every function in the reference's source files (the rule of
    ``is_reference``: alibi_ref outside alibi_ref.course, and the exercises), compiled here from the files."""
    found: dict[tuple, str] = {}

    def walk(code, module: str) -> None:
        for const in code.co_consts:
            if type(const) is types.CodeType:
                size, documented = len(const.co_code), bool(const.co_consts) and type(const.co_consts[0]) is str
                if (size >= (_SMALLEST_COPY if documented else _SMALLEST_UNDOCUMENTED_COPY)
                        and not const.co_name.endswith("comp>") and const.co_name != "<genexpr>"):
                    found.setdefault(_fingerprint(const), f"{module}.{const.co_qualname}")
                walk(const, module)

    for folder, _, names in os.walk(_PACKAGE_DIR):
        for name in sorted(names):
            path = os.path.join(folder, name)
            if not name.endswith(".py") or (path.startswith(_COURSE) and path != _EXERCISES_FILE):
                continue
            try:
                with open(path, "rb") as f:
                    module_code = compile(f.read(), path, "exec", dont_inherit=True)
            except (OSError, SyntaxError, ValueError):  # a file that is not there or not source: nothing to match
                continue
            walk(module_code, path.removeprefix(_PARENT).removesuffix(".py").replace(os.sep, "."))
    return found


def _audit_hook(machinery: list[tuple[str, object, str, object]],
                whole: list[tuple[str, dict]]) -> tuple[Callable, Callable]:
    """Python's audit hooks, for the life of the interpreter (an audit hook cannot be removed): the guards'
    state, and the ways around them it refuses; and the hook that raises the refusals (``_refuser``).

    The state lives in this closure, which no name reaches: only the interpreter holds the hook, and
    walking the interpreter's objects to find it is refused. No exception leaves the hook, since its
    traceback would hold the hook's frame and the frame the closure: what it refuses, the second hook
    raises afresh (``defer``); an exception it meets (a signal's, memory running out) refuses the event
    and fails every running check; and when grading, the answer's ways to put an exception of its own
    inside it (a signal handler, a signal sent) are refused. No code of the answer's runs in it either
    (its frame's ``f_back`` would lead here): only exact built-in types are read, and a namespace the
    checks look names up in is first checked to hold str keys alone. Each guard gets a random secret name on
    entering (``_ENTER``, raised by ``ReferenceGuard.__enter__`` itself, or ignored), with its trusted
    and excused code; ``_RECORD`` keeps the first reason given for a guard; ``_EXIT`` hands the record
    back once and forgets the guard. The profile functions' events (``_PROFILE_EVENT``) drive the trust
    of the innermost guard and record its reference calls. It also records, for every guard running:

    - ``sys.setprofile`` called by anything but the guard itself or a thread's start: the guard switched
      off, even if the answer puts the hook back before the check ends;
    - the events in ``_REACH_EVENTS``, ``_REACH_ATTRIBUTES``, ``_REACHED_THROUGH_STDLIB`` and ctypes',
      raised by the answer's own code: a way around the guard, however the function was reached (a
      computed name, ``map``, a module found at run time), where the profiler sees only what is called
      from Python and the screen only what is written. The call raises instead of happening, while a
      guard runs and, when grading, at any time: a cell of the student's own gets nothing from it either.

    When grading begins (``take_over``) it replaces the functions that start threads, make fresh
    built-in modules and set or send signals (``_REPLACED``), keeping the real ones here: every thread
    then starts under the thread profile, however started.

    What it needs is taken now, into this closure: rebinding the module's names changes nothing, and
    nothing it calls is Python code an answer could have replaced. Every other event returns at once.
    """
    enter_code, exit_code = ReferenceGuard.__enter__.__code__, ReferenceGuard.__exit__.__code__
    setprofile, thread_profile, real, interrupt_main = (_setprofile, _THREAD_PROFILE, dict(_REAL_FUNCTIONS),
                                                        _REAL_FUNCTIONS["interrupt_main"])
    replaced, Namespace = list(_REPLACED), types.SimpleNamespace
    asking = {_start_thread.__code__: "start_new_thread", _create_builtin_module.__code__: "create_builtin",
              _set_signal_handler.__code__: "signal", _raise_signal.__code__: "raise_signal",
              _interrupt_main.__code__: "interrupt_main"}  # the code that may ask for each real function

    def run_watched(function, args, kwargs):  # a thread's first call when grading: the profile, then its work
        setprofile(thread_profile)
        return function(*args, **kwargs)

    setters = frozenset({enter_code, exit_code, threading.Thread._bootstrap_inner.__code__, run_watched.__code__})
    # where a cell's code (IPython runs it) or a thread's begins: above them, the code that asked
    beginnings = frozenset({threading.Thread._bootstrap_inner.__code__, run_watched.__code__, *_cell_runners()})
    threads_setprofile = _threads_setprofile.__code__
    getframe, new_token, get_ident, sep, fingerprint = _getframe, os.urandom, threading.get_ident, os.sep, _fingerprint
    inside, course, exercises_file, parent, installed = _INSIDE, _COURSE, _EXERCISES_FILE, _PARENT, _INSTALLED
    reach_events, reach_attributes, reached_through_stdlib, stdlib, process_events = (
        dict(_REACH_EVENTS), dict(_REACH_ATTRIBUTES), dict(_REACHED_THROUGH_STDLIB), _STDLIB, _PROCESS_EVENTS)
    profile_event, thread_event, enter, record_event, leave = _PROFILE_EVENT, _THREAD_EVENT, _ENTER, _RECORD, _EXIT
    own_events = frozenset([enter, record_event, leave, _REAL, _PENDING, _DRAW])
    switched_off, nested = SWITCHED_OFF, NESTED
    FrameType, CodeType = types.FrameType, types.CodeType
    # grading (GRADING_ENV set), once seen, for good: a kernel forked from the autograder's zygote gets the
    # variable after this module was imported. Read from os.environ's own dict (bytes keys), whose lookup
    # runs no Python code that an answer could have patched
    environ, grading_key, grading = os.environ._data, os.environ.encodekey(GRADING_ENV), False
    # the grader's secret for the hidden cases, taken from GRADING_ENV as grading begins (before any cell runs,
    # in a kernel forked from the zygote), which then reads "1"; each hidden check is drawn once
    secret, drawn, putenv, run_code = None, set(), os.putenv, run.__code__
    running: dict[bytes, list] = {}  # token -> [record, trusted, excused, {frame: trusted}], in order entered
    innermost = None  # the last guard entered of those running
    busy = set()  # the threads asking for a frame now (which raises an event of its own)

    @functools.lru_cache(maxsize=4096)  # asked for every Python call the answer makes
    def is_reference(filename: str) -> bool:
        """One rule: the reference is alibi_ref outside alibi_ref.course, and the exercises' own references.
        The course's helpers (its example, plots, the chapter's interface, these checks) are for students;
        ``exercises`` holds a reference for every exercise, so it counts as the reference."""
        return filename.startswith(inside) and (not filename.startswith(course) or filename == exercises_file)

    @functools.lru_cache(maxsize=4096)
    def is_answer(filename: str) -> bool:
        """Code neither alibi_ref's nor installed: a notebook's cells (the student's), or code they compiled."""
        return not (filename.startswith(inside) or filename.startswith(installed) or filename.startswith("<frozen "))

    copies = _reference_fingerprints()  # the reference's code by what it is, not by the file it came from
    # code seen -> the reference function it is a copy of, or None. Keyed by the code object (not its id():
    # id raises an audit event of its own, at every call)
    copied: dict = {}
    unseen = object()

    def remember(code) -> str | None:
        """The reference function whose code ``code`` is (loaded from another file, or built from the reference's
        source: the package copied and imported under another name), or None; worked out once per code."""
        found = copied[code] = copies.get(fingerprint(code))
        return found

    def copy_of(code) -> str | None:
        found = copied.get(code, unseen)
        return found if found is not unseen else remember(code)

    def record(run, why) -> None:
        if run is not None and run[0] is None and type(why) is str:
            run[0] = why

    def count(run, frame, where: str = "") -> None:
        code = frame.f_code
        if code is threads_setprofile:  # the hook threads get, changed (and maybe put back) by the answer
            record(run, switched_off)
        elif is_reference(code.co_filename):
            module = code.co_filename.removeprefix(parent).removesuffix(".py")
            record(run, f"{module.replace(sep, '.')}.{code.co_name}{where}")
        elif original := copy_of(code):  # named by its file's last two parts: its folder differs per kernel
            copied_from = sep.join(code.co_filename.rsplit(sep, 2)[-2:])
            record(run, f"the answer ran a copy of the reference's {original} (from {copied_from}){where}, "
                        "a way around the guard against calling the reference")

    def raised_by(code) -> bool:
        """Whether the event being handled was raised by ``code`` (a guard's own events, by the guard)."""
        frame = frame_at(2)  # 0: here, 1: audit, 2: the code that raised the event
        return frame is not None and frame.f_code is code

    def frame_at(depth: int):
        thread = get_ident()
        busy.add(thread)
        try:
            return getframe(depth + 1)
        except ValueError:  # fewer frames: raised from C with no Python frame at all
            return None
        finally:
            busy.discard(thread)

    def around(event: str, args) -> str | None:
        """Why ``event`` is a way around the guard, if the answer's own code raised it."""
        through_stdlib = False
        if event in ("object.__getattr__", "object.__setattr__"):
            what = reach_attributes.get(args[1]) if len(args) > 1 and type(args[1]) is str else None
        else:
            through_stdlib = event.startswith("ctypes.") or event in reached_through_stdlib
            what = reach_events.get(event) or reached_through_stdlib.get(event) or (
                "called C through ctypes" if through_stdlib else None)
        if what is None or (event == "sys._getframe" and get_ident() in busy):
            return None
        frame = frame_at(2)  # 0: here, 1: audit, 2: the code that raised the event
        # what no installed code does for an answer, the first caller outside the standard library (which
        # calls ctypes' C through ctypes/__init__.py) is asked about; a process, every caller
        if event in process_events:
            answered = on_answers_behalf(frame)
        elif through_stdlib:
            answered = asked_by_answer(frame)
        else:
            answered = frame is not None and is_answer(frame.f_code.co_filename)
        if not answered:
            return None
        named = f"{event}: {args[1]}" if event.startswith("object.") else event
        return f"the answer {what} ({named}), a way around the guard against calling the reference"

    # names held in namespaces, looked up each time; a function's parts (code, defaults) are held by the audit
    # event Python raises for every write to them, not read (each read raises an event of its own)
    held = [(what, namespace, name, value) for what, namespace, name, value in machinery
            if type(namespace) is not types.FunctionType]
    function_parts: dict[tuple[int, str], tuple[str, object]] = {}
    for what, fn, part, value in machinery:
        if type(fn) is types.FunctionType:
            function_parts.setdefault((id(fn), part), (what, value))  # named as first held: its module's name
    parts, parts_written = frozenset(_FUNCTION_PARTS), {}  # (function, part) -> "function.part", while not put back
    caches = _PYTHON_CACHES

    def size(namespace) -> int:  # the names in it, less the caches Python itself adds
        return len(namespace) - sum(name in namespace for name in caches)

    sizes = [(what, namespace, size(namespace)) for what, namespace in whole]
    missing = object()
    def held_namespaces() -> list:
        return list({id(namespace): namespace for _, namespace, _, _ in held}.values())

    namespaces = held_namespaces()
    only_str = {str}

    def changed() -> str | None:
        """The first part of the checks' machinery that is not what it was (``_machinery``), or None.
        First, that every key of the namespaces looked into is a str: the lookups below would run the
        __eq__ of any other key whose hash matches (a str subclass set as an attribute, say), in here."""
        for namespace in namespaces:
            if {*map(type, namespace)} - only_str:  # in C, in one step: no key's code runs, no thread imports meanwhile
                return "a key that is not a str, in a namespace the checks read"
        if parts_written:
            return next(iter(parts_written.values()))
        for what, namespace, name, value in held:
            if namespace.get(name, missing) is not value:
                return what
        for what, namespace, before in sizes:
            if size(namespace) != before:
                return f"a name added to {what}"
        return None

    def refusal(part: str) -> str:
        return f"the checks' own machinery was changed ({part}), a way around the guard against calling the reference"

    def take_over() -> None:
        """From the moment grading begins: threads start under the thread profile (threading's own set
        its _profile_hook as they start), and the answer's way to an exception inside this hook (a signal
        handler of its own, a signal sent) goes through here. Putting a real function back (a fresh copy of
        its module, a name rebound) is a change to the machinery."""
        for module, namespace, name, value in [*replaced, ("threading", vars(threading), "_profile_hook",
                                                            thread_profile)]:
            namespace[name] = value
            held.append((f"{module}.{name}", namespace, name, value))
        namespaces[:] = held_namespaces()

    def call_real(done: list, name: str, args: tuple) -> None:
        """The real function's work for its replacement, with the checks the real one makes of its arguments,
        and none of the answer's code run in here."""
        if name == "start_new_thread":
            function, arguments, kwargs = args
            if not callable(function):
                raise TypeError("first arg must be callable")
            if type(arguments) is not tuple:
                raise TypeError("2nd arg must be a tuple")
            if kwargs is not None and type(kwargs) is not dict:
                raise TypeError("optional 3rd arg must be a dictionary")
            done.append(real[name](run_watched, (function, arguments, kwargs or {})))
            return
        if name == "create_builtin":
            if type(args[0]) is not str:
                raise TypeError("a module spec's name must be a str")
            if args[0] in ("_thread", "_imp", "_signal"):
                raise RuntimeError(f"a fresh copy of the module {args[0]} is refused while grading (it would hold "
                                   "the functions grading replaced)")
            done.append(real[name](Namespace(name=args[0])))  # the name alone: no object of the answer's is read
            return
        if type(args[0]) is not int:  # a signal's number, as int() made it in the replacement
            raise TypeError("a signal number must be an int")
        by_answer = grading and asked_by_answer(frame_at(3))  # 0: here, 1: audit, 2: the replacement, 3: its caller
        if by_answer and name == "signal" and type(args[1]) is not int:  # SIG_DFL and SIG_IGN are ints
            raise RuntimeError("the answer set a signal handler of its own (signal), a way around the guard "
                               "against calling the reference")
        if by_answer and name != "signal":
            raise RuntimeError(f"the answer sent a signal ({name}), a way around the guard against calling the "
                               "reference")
        done.append(real[name](*args))

    def on_answers_behalf(frame) -> bool:
        """Whether any caller, from ``frame`` up to where a cell or a thread began, is the answer's code. Below
        a cell lies the kernel's machinery (in a kernel forked from the autograder's zygote, the zygote's code,
        which is not installed): a frame with neither a cell nor a thread's start below it is the kernel's,
        asked about as before (the first caller outside the standard library)."""
        first, seen = frame, False
        while frame is not None:
            if frame.f_code in beginnings:
                return seen
            seen = seen or is_answer(frame.f_code.co_filename)
            frame = frame.f_back
        return asked_by_answer(first)

    def asked_by_answer(frame, past: tuple[str, ...] = stdlib) -> bool:
        """Whether the first caller outside the standard library (or ``past``), from ``frame`` up, is the
        answer's code."""
        while frame is not None and frame.f_code.co_filename.startswith(past):
            frame = frame.f_back
        return frame is not None and is_answer(frame.f_code.co_filename)

    def keep_secret() -> bytes | None:
        value = environ[grading_key]
        environ[grading_key] = b"1"
        putenv(GRADING_ENV, "1")
        try:
            key = bytes.fromhex(value.decode("ascii"))
        except ValueError:
            return None
        return key if len(key) == SECRET_BYTES else None

    def draw(name: str, seed: int) -> bytes | None:
        """The secret for one hidden check, once: a second draw means the cases were drawn before the check
        (``run`` called by a cell of the student's, to learn the inputs and compute the reference on them)."""
        if secret is None:
            return None
        if (name, seed) in drawn:
            raise RuntimeError(f"the hidden cases of {name} were drawn before this check ran (by a cell calling the "
                               "checks' run), a way around the guard against calling the reference")
        drawn.add((name, seed))
        return secret

    # a process's environment and memory (/proc/*/environ, /proc/*/mem), where the secret was on its way in (a
    # kernel started on its own has it in /proc/self/environ): opened, or linked to under another name
    peeks = frozenset(["open", "os.symlink"])

    def peek(args) -> str | None:
        path = opened_path(args[0] if args else None)
        if path is None and args and not isinstance(args[0], int):
            # an object of its own, whose __fspath__ may have named another file when open converted it
            if asked_by_answer(frame_at(2), (*installed, "<frozen ")):
                return "the answer opened a file named by an object of its own, a way around the guard"
            return None
        if path is None or path.rstrip(sep).rpartition(sep)[2] not in ("environ", "mem"):
            return None
        # past every installed caller: IPython's own open() is the one a cell calls
        if not asked_by_answer(frame_at(2), (*installed, "<frozen ")):  # 0: here, 1: audit, 2: the raiser
            return None
        return f"the answer read a process's environment or memory ({path}), a way around the guard"

    pending: dict[int, tuple] = {}  # thread -> (exception type, message): a refusal for _refuser to raise
    # the events this hook may refuse (the attributes' events only for reach_attributes): _refuser's too
    candidates = frozenset([*reach_events, *reached_through_stdlib, *peeks, _REAL, _DRAW, leave, "exec",
                            "sys.setprofile"])

    def asked(event: str, args) -> bool:
        """Whether _refuser asks about this event (its own test, inline there: it runs for every event)."""
        return event in candidates or event[:7] == "ctypes." or (
            event[:7] == "object." and len(args) > 1 and type(args[1]) is str and args[1] in reach_attributes)

    def defer(event: str, args, err: BaseException) -> None:
        """What this hook raised (a refusal) or met (a signal's exception, memory or recursion running out),
        kept for _refuser to raise as a fresh exception, with no frame of this hook's in its traceback."""
        kind = type(err)
        if kind is KeyboardInterrupt:
            interrupt_main()  # raised again in the main thread, outside this hook
            return
        if (kind is RuntimeError or kind is TypeError) and err.args and type(err.args[0]) is str:
            why = err.args[0]
        else:  # anything else is a failure of the guard's: refused, and every running check's record says so
            kind, why = RuntimeError, f"the guard could not decide on {event} (it met an exception): refused"
            for run in running.values():
                record(run, why)
        if asked(event, args):  # else it would wait, and be raised at some later event
            pending[get_ident()] = (kind, why)

    def audit(event: str, args) -> None:
        nonlocal innermost, grading, secret
        try:
            # the profiler's events first, (frame, "call" or "return" or "c_call"..., arg): they come for every call
            # the answer makes. Per frame running now, whether it runs on a trusted function's behalf: trust
            # passes to what a trusted function calls, but not through the answer's own code (a trusted helper
            # that calls back into the answer, as an int subclass's __lt__ or an object's __array__, gives that
            # code no trust). Kept by frame, not as a stack, so that an event the answer makes up (it can call the
            # profile function itself) can only take trust away: a frame no call was seen for is not trusted
            if event == thread_event:  # every call in every thread watched: counted only while a guard runs
                if innermost and len(args) == 3 and type(args[0]) is FrameType and type(args[1]) is str and (
                        args[1] == "call"):
                    count(innermost, args[0], " (in another thread)")
                return
            if event == profile_event:
                if innermost and len(args) == 3 and type(args[0]) is FrameType and type(args[1]) is str:
                    frame, kind = args[0], args[1]
                    trusted, excused, trust = innermost[1], innermost[2], innermost[3]
                    if kind == "call":
                        code = frame.f_code
                        caller_trusted = trust.get(frame.f_back, False)
                        trust[frame] = code in trusted or (caller_trusted and not is_answer(code.co_filename))
                        if not caller_trusted and code not in trusted and code not in excused and (
                                code is threads_setprofile or is_reference(code.co_filename)
                                or copy_of(code)):
                            count(innermost, frame)
                    elif kind == "return":
                        trust.pop(frame, None)
                return
            if event == "object.__getattr__" and (not running or len(args) != 2 or type(args[1]) is not str
                                                  or args[1] not in reach_attributes):
                return  # the profiler's own reads of f_code, and every attribute no way around the guard reads
            if (event == "object.__setattr__" and len(args) == 3 and type(args[1]) is str and args[1] in parts
                    and (id(args[0]), args[1]) in function_parts):
                what, value = function_parts[id(args[0]), args[1]]
                if args[2] is value:
                    parts_written.pop((id(args[0]), args[1]), None)  # put back
                else:
                    parts_written[id(args[0]), args[1]] = what
            if not grading and grading_key in environ:
                grading = True
                secret = keep_secret()
                take_over()
            if not (running or grading or event in own_events):
                return  # a student's own session, no check running: nothing to keep or refuse
            # the guards' own events can be raised by an answer too, with objects of its own: only exact types are
            # read, so that no code of the answer's (an __eq__, an append) runs in here
            kinds = tuple(map(type, args))
            if event == _REAL and kinds == (list, str, tuple):
                asker = frame_at(1)  # 0: here, 1: the code that raised the event
                if asker is not None and asking.get(asker.f_code) == args[1]:
                    call_real(*args)
            elif event == _DRAW and kinds == (list, str, int) and raised_by(run_code):
                args[0].append(draw(args[1], args[2]))
            elif event == _PENDING and kinds == (list,):
                waiting = pending.pop(get_ident(), None)
                if waiting is not None:
                    args[0].append(waiting)
            elif event == enter and kinds == (list, frozenset, frozenset) and raised_by(enter_code) and all(
                    type(code) is CodeType for code in args[1] | args[2]):
                # no check runs inside another: only an answer starts a guard while one runs
                for run in running.values():
                    record(run, nested)
                token = new_token(16)
                running[token] = innermost = [None, args[1], args[2], {}]
                part = changed()
                if part:
                    record(innermost, refusal(part))
                args[0].append(token)
            elif event == record_event and kinds[:1] == (bytes,) and len(args) == 2:
                record(running.get(args[0]), args[1])
            elif event == leave and kinds == (bytes, list) and raised_by(exit_code):
                if args[0] not in running:
                    raise RuntimeError("this guard is not running: it has exited already")
                part = changed()
                if part:
                    record(running[args[0]], refusal(part))
                args[1].append(running.pop(args[0])[0])
                innermost = next(reversed(running.values()), None)
            elif event == "sys.setprofile":
                setter = frame_at(1)  # 0: here, 1: the code that called it
                if setter is None or setter.f_code not in setters:
                    for run in running.values():
                        record(run, switched_off)
                    why = grading and around(event, args)  # a thread of the answer's taking its own profile off
                    if why:
                        raise RuntimeError(why)
            else:
                # a notebook cell about to run (a file of ipykernel's; code the standard library builds has a name
                # of its own, as namedtuple's): IPython reports what this raises as the cell's error
                part = (grading and event == "exec" and kinds == (CodeType,) and args[0].co_filename.startswith(sep)
                        and is_answer(args[0].co_filename) and changed())
                if part:
                    raise RuntimeError(refusal(part) + ": no cell runs after that")
                why = around(event, args) or (grading and event in peeks and peek(args))
                if why:
                    for run in running.values():
                        record(run, why)
                    raise RuntimeError(why)  # and it does not happen: the answer gets nothing from it
        except BaseException as err:
            try:
                defer(event, args, err)
            except BaseException:
                pass

    return audit, _refuser(candidates, frozenset(reach_attributes))



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
    # each call gets inputs of its own: cases share arrays (the chapter's Q, K, V), and an answer that changes
    # its inputs in place (`x -= x.max()`) must not change the next case's, or the next exercise's
    args, kwargs, where = _fresh(case.args), _fresh(dict(case.kwargs)), None
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


def _uncompiled():
    """For one check: no compiled program made before it runs inside it, and what ``torch.compile`` made runs
    as the Python it was made from, watched by the guard.

    A program compiled before the check runs without a frame of the code it was traced from: the reference
    under ``jax.jit``, warmed in an earlier cell for the shapes the hidden cases draw from, passed every check
    of ``alibi_bias_jax``, and under ``torch.compile`` with dynamic shapes ``sdpa_alibi``'s visible ones. So
    JAX's caches are emptied (a jitted function is traced again, its Python watched), and so are dynamo's
    (compiling again reads the answer's code, which the guard refuses), and compiled functions run eagerly
    (PyTorch's "force_eager" stance): an honest answer through ``torch.compile`` runs as written. Once per
    check, not per case: what the check's own cases compile was traced under the guard. Nothing to do for a
    library nothing imported (``torch.compile`` imports dynamo).
    """
    jax = sys.modules.get("jax")
    if jax is not None:
        jax.clear_caches()
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is None:
        return contextlib.nullcontext()
    dynamo.reset()
    set_stance = getattr(sys.modules["torch"].compiler, "set_stance", None)  # torch >= 2.6; before, reset alone
    return set_stance("force_eager") if set_stance is not None else contextlib.nullcontext()


def _fresh(value):
    """``value`` with every array, list, tuple and dict in it copied (the cases' own types: nothing else is)."""
    if type(value) is np.ndarray:
        return value.copy()
    if type(value) in (list, tuple):
        return type(value)(_fresh(x) for x in value)
    if type(value) is dict:
        return {k: _fresh(v) for k, v in value.items()}
    return value


def _with_reference_upstream(answer: Callable, names: list[str]) -> Callable:
    """``answer`` run with the reference's version of each upstream answer it calls by name."""
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
    secret = None
    if seed is not None:
        given = []
        _audit(_DRAW, given, str(name), int(seed))  # the grader's secret when grading (raises for a second draw)
        secret = given[0]
    chosen = cases(name, seed, secret)
    if any(case.device == "meta" for case in chosen):
        _warm_up_meta()
    call = answer if callable(answer) else functools.partial(_look_up, answer)
    upstream = [n for n in ex.upstream if callable(answer) and n in getattr(answer, "__globals__", {})]
    with _uncompiled():
        payload = {"exercise": ex.name, "seed": None if seed is None else int(seed),
                   "results": [_call(call, case, ex, device) for case in chosen]}
        if upstream:
            rebound = _with_reference_upstream(answer, upstream)
            payload["upstream"] = upstream
            payload["with_reference_upstream"] = [_call(rebound, case, ex, device, lent=True) for case in chosen]
    if secret is not None:
        # what leaves this function passes through code of the kernel's that any cell may rebind (IPython's
        # display, ipykernel's session, json, zmq): signed here, a value changed on the way no longer matches
        try:
            payload["signature"] = _signature(secret, payload)
        except TypeError:  # something in it the checks did not make: unsigned, so judged wrong
            pass
    return payload


def _signature(secret: bytes, payload: dict) -> str:
    """The grader's proof that ``payload`` is what ``run`` made: an HMAC-SHA256 of its canonical text, keyed
    with a key made from the grader's secret (not the secret itself, which also seeds the hidden cases)."""
    key = _hmac_digest(secret, b"alibi-course: the values a check hands back", "sha256")
    return _hmac_digest(key, _canonical(payload).encode(), "sha256").hex()


_PATHLIB_TYPES = (pathlib.PosixPath, pathlib.PurePosixPath, pathlib.WindowsPath, pathlib.PureWindowsPath)


def opened_path(path) -> str | None:
    """The path ``open`` was given, as the C code read it (a str or bytes subclass by its own characters, never
    through a method of its own), or None where it was neither those nor one of pathlib's own classes."""
    if isinstance(path, str):
        return str.__str__(path)
    if isinstance(path, (bytes, bytearray)):
        return bytes(memoryview(path)).decode("utf-8", "replace")
    if type(path) in _PATHLIB_TYPES:
        return str(path)
    return None


def _canonical(data) -> str:
    """``data`` (dicts with str keys, lists, tuples, str, int, bool and None, of exactly those types) as one
    text that a trip through JSON does not change. Anything else raises TypeError. Only exact types are read,
    in C: no method of an answer's object runs here, outside the guard."""
    kind = type(data)
    if data is None or kind is bool or kind is int:
        return repr(data)
    if kind is str:
        return _json_string(data)
    if kind is list or kind is tuple:
        return "[" + ",".join(map(_canonical, data)) + "]"
    if kind is dict and all(type(k) is str for k in data):
        return "{" + ",".join(_json_string(k) + ":" + _canonical(data[k]) for k in sorted(data)) + "}"
    raise TypeError("not a value the checks make")


def _signed(payload: dict, secret: bytes) -> bool:
    """Whether a payload (read back from a notebook: JSON's types) carries ``run``'s signature for ``secret``."""
    body = json.loads(json.dumps({k: v for k, v in payload.items() if k != "signature"}))  # plain dicts and lists
    try:
        expected = _signature(secret, body)
    except TypeError:
        return False
    return hmac.compare_digest(str(payload.get("signature", "")).encode(), expected.encode())


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


def judge(payload: dict, secret: bytes | None = None) -> Verdict:
    """Compare a payload's results with the reference's (``secret``: the grader's, with which the kernel drew
    the hidden cases). Raises ValueError for a malformed payload."""
    name, seed = payload["exercise"], payload["seed"]
    ex = _exercise(str(name))
    if seed is not None and not isinstance(seed, int):
        raise ValueError("bad seed")
    if seed is not None and secret is not None and not _signed(payload, secret):
        return Verdict(False, f"{ex.name}: the values handed back are not the ones the check made (changed on their "
                              "way out of the check, or made outside it): no points for this exercise")
    chosen = cases(ex.name, seed, secret)
    results = list(payload["results"])
    if len(results) != len(chosen):
        raise ValueError(f"{len(results)} results for {len(chosen)} cases")
    where = "hidden" if seed is not None else "visible"
    passed = f"{len(chosen)} {where} check{'s pass' if len(chosen) != 1 else ' passes'}"
    expected = expected_values(ex.name, seed, secret)
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
_EXPECTED: dict[tuple[str, int | None, bytes | None], list] = {}


def expected_values(name: str, seed: int | None, secret: bytes | None = None) -> list:
    """The reference's values for one check call's cases, computed once per process: a grader judges a
    whole class on the same cases, and some references (Flax's layers) take seconds. ``save_expected``
    computes them once for a course; ``load_expected`` lends them to the processes that judge."""
    if (name, seed, secret) not in _EXPECTED:
        ex = _exercise(name)
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


def _problem(ex: Exercise, case: Case, result, expected) -> str | None:
    if not isinstance(result, dict):
        raise ValueError("bad result")
    call = result.get("reference_call")
    if call and not str(call).startswith(_PACKAGE_NAME + "."):  # the guard refused a way around it
        return f"{call}: no points for this exercise"
    if call:
        return f"calls {call} from the reference module: write it yourself (no points for this exercise)"
    if "raised" in result:
        if case.raises and str(result["raised"]).split(":")[0] == case.raises:
            return None
        if result["raised"] == "NotImplementedError":  # what the answer cell's stub raises
            return ("raised NotImplementedError, as the answer cell does before it is answered: not answered yet "
                    "(an answer written in another cell is replaced when the answer cell runs after it)")
        return f"raised {str(result['raised'])[:300]}"
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
        for n, (g, e) in enumerate(zip(got, expected, strict=True)):
            problem = compare(g, e, case, f"{path}[{n}]")
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
        return f"a list or tuple of {len(x)} items"
    return repr(x)[:80]


class Expect:
    """An expectation that is not a value: subclasses say what they check."""

    def check(self, got, case: Case, at: str) -> str | None:  # pragma: no cover - abstract
        raise NotImplementedError


def _name_the_mistake(ex: Exercise, chosen: list[Case], results: list) -> str | None:
    """The hint of the first classic mistake that reproduces every handed-back value."""
    usable = [(c, r) for c, r in zip(chosen, results, strict=True)  # a value the reference made names nothing
              if isinstance(r, dict) and "value" in r and not r.get("reference_call") and c.expected is None
              and not c.raises]
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


# ----------------------------------------------------------------------------- the machinery, held to what it is

def _machinery(*held: types.ModuleType) -> tuple[list[tuple[str, object, str, object]], list[tuple[str, dict]]]:
    """What runs in the kernel besides the answer when a check runs: (what, namespace, name, object now) for
    each part, and (what, namespace) for the namespaces held whole, to which no name may be added.

    A cell that rebinds any of it (this module's ``run``, an exercise's ``allowed`` helpers, the
    builtins the checks call, ``builtins.__import__`` or the module in ``sys.modules`` that a test cell
    imports ``check`` from) could hand the check values computed with the reference before its guard
    starts, or skip the guard. The audit hook holds every entry to the object it is now: the checks,
    the exercises and the harness modules whole (no name added either), the classes defined here, each
    exercise's fields, each of their functions' code and defaults, the builtins their code names, and
    the few functions of numpy, torch and IPython a check calls before its guard or to hand values back.
    """
    import builtins

    import numpy.random  # noqa: F401  (numpy loads it on first use: held from here on)

    modules = [sys.modules[__name__], *held]
    entries: list[tuple[str, object, str, object]] = []
    whole: list[tuple[str, dict]] = []

    def hold(what: str, namespace, names=None) -> None:
        if names is None:
            whole.append((what, namespace))
        for name in (names if names is not None else list(namespace)):
            if name in namespace and name not in _PYTHON_CACHES:
                entries.append((f"{what}.{name}", namespace, name, namespace[name]))

    def code_names(code) -> set[str]:
        return set(code.co_names).union(*(code_names(c) for c in code.co_consts if isinstance(c, types.CodeType)))

    referenced: set[str] = set()

    def hold_functions(where: str, values) -> None:
        nonlocal referenced
        for fn in values:
            if isinstance(fn, types.FunctionType):
                referenced |= code_names(fn.__code__)
                name = f"{where or fn.__module__ + '.'}{fn.__qualname__}"
                entries.extend((f"{name}.{a}", fn, a, getattr(fn, a)) for a in _FUNCTION_PARTS)

    for module in modules:
        hold(module.__name__, vars(module))
        entries.append((f"sys.modules[{module.__name__!r}]", sys.modules, module.__name__, module))
        hold_functions("", list(vars(module).values()))
        for value in list(vars(module).values()):
            if isinstance(value, type) and value.__module__ == module.__name__:  # a class defined there
                hold(f"{module.__name__}.{value.__name__}", value.__dict__)
                hold_functions("", list(vars(value).values()))
    for ex in EXERCISES.values():
        hold(f"the exercise {ex.name!r}", vars(ex))
        hold_functions(f"{ex.name}.", vars(ex).values())
    hold("EXERCISES", EXERCISES)
    hold("builtins", vars(builtins), sorted((referenced | {"__import__"}) - _SWAPPED_BUILTINS))
    for module, names in _CALLED_AROUND_THE_GUARD.items():
        if module in sys.modules:
            hold(module, vars(sys.modules[module]), names)
    return entries, whole


# names Python adds to a namespace as it runs: a module's registry of the warnings its code gave, a class's
# cache of its slots once an instance is pickled or copied (copyreg)
_PYTHON_CACHES = frozenset({"__warningregistry__", "__slotnames__"})
# a function's parts a cell could replace without a name: its code (audited too) and its defaults
_FUNCTION_PARTS = ("__code__", "__defaults__", "__kwdefaults__")
# builtins the kernel itself swaps while it runs (ipykernel's input for each request, IPython's exit and quit)
_SWAPPED_BUILTINS = {"input", "exit", "quit", "get_ipython", "display", "help", "_", "__", "___"}
# modules whose functions a check calls outside the answer's guard: to draw the cases, to make inputs, to
# hand values back (IPython's display, imported by the kernel before any cell)
_CALLED_AROUND_THE_GUARD = {"numpy.random": ["default_rng"], "torch": ["tensor"],
                            "IPython.display": ["display"], "IPython.core.display_functions": ["display"]}

_GUARDED: list[bool] = []


def guard(*held: types.ModuleType) -> None:
    """Start the guard: the audit hook that holds this module and the ``held`` modules (the exercises and the
    harness) as they are from now on, and watches every answer a check runs. ``alibi_ref.course`` calls it once
    every exercise is registered, before any cell can run; a second call changes nothing (a hook cannot be
    taken back, and this list is held with the rest of this module)."""
    if _GUARDED:
        return
    _GUARDED.append(True)
    # the hooks run in the order added: the one that decides, then the one that raises what it decided
    list(map(sys.addaudithook, _audit_hook(*_machinery(*held))))
