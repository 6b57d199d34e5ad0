"""What a graded kernel sees of alibi_ref: the autograder binds a view, written here, in place of the package.

A view holds what every kernel needs (``KERNEL_FILES``: the checks, what crosses to the grader,
the example, the adapters), the helpers its exercises may use and nothing else: not the
reference, not ``exercises``, not the judge. An answer cannot call what is not there, so nothing
in the kernel watches for it. Each exercise names its helpers (``Exercise.helpers``); a notebook
runs once per distinct set among its exercises, and each exercise is judged from the run whose
view holds exactly its own (``helpers_of``), so a helper one exercise may use never answers another.

A rescue run's view adds the reference's version of the upstream answers it lends
(``upstream.py``), only those: the downstream verdict is read from that run, nothing else.
"""

from __future__ import annotations

import inspect
import shutil
from pathlib import Path

from . import upstream
from .model import find

PACKAGE = Path(__file__).resolve().parents[1]  # alibi_ref
KERNEL_FILES = ("course/checks.py", "course/wire.py", "course/harness.py", "course/examples.py",
                "course/predict.py")
LIBRARY = "the library"  # every module of alibi_ref's own, and the chapter's interface on them
# a helper an exercise may use -> the files it needs, and the line that makes it alibi_ref's (or the course's) name
HELPERS = {
    "get_slopes": (("slopes.py",), "from .slopes import get_slopes"),
    "multi_head_alibi": ((LIBRARY, "course/chapter.py"), None),
}
BARE = "bare"  # the view with no helper: most notebooks'

PLOTS = '''"""The course's plots draw the reference's values, which a graded kernel does not have. Here every plot is
a function that draws nothing and returns None: no answer uses one, and a cell that draws gets nothing."""


def shared_scale(*biases):
    return {}  # what a cell spreads into the plots' keywords (`**scale`): nothing to spread


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return _nothing


def _nothing(*args, **kwargs):
    return None
'''

PACKAGE_INIT = '''"""alibi_ref as a graded kernel sees it: the course's checks, its example and adapters, and only
the helpers this notebook's answers may use (alibi_ref/course/view.py). The reference is not here."""

import importlib

{exports}
_COURSE = {course_names!r}  # names alibi_ref kept for the course's before the course had its own layer


def __getattr__(name):
    if name in _COURSE:
        return getattr(importlib.import_module(".course", __name__), name)
    raise ImportError(f"alibi_ref.{{name}} is not available while grading: a graded answer uses only what its "
                      "notebook lends it (the prompt says what), and writes the rest itself")
'''

COURSE_INIT = '''"""The course's layer as a graded kernel sees it (alibi_ref/course/view.py)."""

from . import checks, examples, harness, plots
from .examples import cat_sat_on_mat
{exports}'''


def helpers_of(names) -> tuple[str, ...]:
    """The helpers every exercise in ``names`` may use, sorted: the key of the view they are judged in."""
    return tuple(sorted({helper for name in names for helper in find(name).helpers}))


def view_key(helpers: tuple[str, ...], lent: tuple[str, ...] = ()) -> str:
    """A view's folder name: its helpers, and the upstream answers it lends."""
    key = "+".join(helpers) or BARE
    return key + "".join(f"+lends-{name}" for name in sorted(lent))


def helpers_in(key: str) -> tuple[str, ...]:
    """The helpers of a view, from its key (``view_key``, without lent answers)."""
    return tuple(h for h in key.split("+") if h != BARE and not h.startswith("lends-"))


def write_view(folder: Path, helpers: tuple[str, ...] = (), lent: tuple[str, ...] = ()) -> Path:
    """Write the view with ``helpers`` (and the reference's ``lent`` upstream answers) into ``folder``, which then
    holds one package folder, alibi_ref. Returns ``folder``."""
    unknown = [h for h in helpers if h not in HELPERS] + [n for n in lent if n not in upstream.LENT]
    if unknown:
        raise KeyError(f"no helper or upstream answer called {', '.join(unknown)}; helpers: {', '.join(HELPERS)}")
    root = Path(folder) / "alibi_ref"
    shutil.rmtree(root, ignore_errors=True)
    files = {*KERNEL_FILES, *(f for h in helpers for f in HELPERS[h][0])}
    if LIBRARY in files:
        files = files - {LIBRARY} | {p.name for p in PACKAGE.glob("*.py")} | {
            str(p.relative_to(PACKAGE)) for p in (PACKAGE / "csrc").rglob("*") if p.is_file()}
    for name in sorted(files):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(PACKAGE / name, root / name)
    exports = [line for h in helpers if (line := HELPERS[h][1])]
    course_names = {"cat_sat_on_mat", "examples", "plots"} | {"multi_head_alibi"} & set(helpers)
    if "__init__.py" not in files:  # the library's own __init__ where the library is in the view
        (root / "__init__.py").write_text(PACKAGE_INIT.format(exports="\n".join(exports),
                                                              course_names=sorted(course_names)))
    chapter = "from .chapter import multi_head_alibi\n" if "multi_head_alibi" in helpers else ""
    (root / "course" / "__init__.py").write_text(COURSE_INIT.format(exports=chapter))
    (root / "course" / "plots.py").write_text(PLOTS)
    if lent:
        (root / "course" / "upstream.py").write_text(_lent_source(lent))
    return Path(folder)


def _lent_source(lent: tuple[str, ...]) -> str:
    """upstream.py with only the ``lent`` functions (each stands alone: upstream.py says so)."""
    functions = "\n\n".join(inspect.getsource(upstream.LENT[name]) for name in sorted(lent))
    table = ", ".join(f"{name!r}: {name}" for name in sorted(lent))
    return (f'"""The reference\'s {", ".join(sorted(lent))}, lent to this rescue run (alibi_ref/course/upstream.py)."""'
            f"\n\nfrom __future__ import annotations\n\nimport numpy as np\n\n\n{functions}\n\nLENT = {{{table}}}\n")
