"""JAX's compilation cache: filled once per assignment from the released notebooks, lent to every kernel.

A notebook that uses JAX spends much of its time compiling: every operation run eagerly and every
``jax.jit`` is compiled by XLA for its shapes. JAX can keep compiled programs on disk (its persistent
compilation cache, keyed by the program, the jaxlib version, the backend and the compile options).
So the grader runs the assignment's released notebooks that import JAX once, in the sandbox like any
kernel (the students' view of the package), while the source stays unchanged, and keeps the cache
they filled: the programs of the locked cells and of what the library compiles for any answer. Never
the instructor's notebooks: a kernel holds a copy of the cache, and JAX can load and run a cached
executable by hand, so a solution compiled into it would be the reference in another form.

Each kernel starts with a private copy in its scratch folder (``JAX_COMPILATION_CACHE_DIR``, see
``sandbox.kernel_env``): it reads what it needs and adds what it compiles, and what it adds goes
with its folder, so nothing one student runs reaches another. A cached program is the one XLA would
compile; XLA refuses to load one built for a CPU with other features and compiles afresh. Locally the
cache lives in the grading output's state; a Dask worker machine fills its own, once.

Two settings make it work for notebooks (``sandbox.kernel_env``): every program is cached, however
quick to compile (a notebook compiles hundreds of small ones), and XLA's GPU autotuning cache is
left off, because JAX would write its folder, different in every kernel, into every cache key.
"""

from __future__ import annotations

import logging
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import nbformat
from jupyter_core.utils import run_sync
from nbclient import NotebookClient

from .sandbox import JAX_CACHE, SandboxedKernelManager, SandboxPolicy

log = logging.getLogger(__name__)

# a notebook that uses JAX says so in an import
_IMPORTS_JAX = re.compile(r"^\s*(?:import|from)\s+(?:jax|flax)\b", re.MULTILINE)


def uses_jax(nb) -> bool:
    """Whether a notebook (or the notebook file at that path) imports JAX or Flax."""
    if isinstance(nb, (str, Path)):
        nb = nbformat.read(nb, as_version=4)
    return any(c.cell_type == "code" and _IMPORTS_JAX.search(c.source) for c in nb.cells)


def fill(source: Path, target: Path, policy_for: Callable[[Path], SandboxPolicy], cell_timeout: int) -> int:
    """Run the notebooks in ``source`` that import JAX (the released ones: no solution in them) in the
    sandbox each gets (``policy_for(path)``) and keep the compilation cache they fill in ``target``. Returns
    the number of programs cached. A notebook that fails fills what it reached: the cache only makes
    grading faster."""
    notebooks = [(path, nb) for path in sorted(source.glob("*.ipynb")) if uses_jax(nb := nbformat.read(path, 4))]
    shutil.rmtree(target, ignore_errors=True)
    if not notebooks:
        return 0
    for path, nb in notebooks:  # each in a folder of its own, handed to the sandbox's user (sandbox.hand_over)
        with tempfile.TemporaryDirectory(prefix="autograder-compile-cache-") as tmp:
            scratch = Path(tmp)
            for data in source.iterdir():  # the data files the notebooks read
                if data.is_file() and data.suffix != ".ipynb":
                    shutil.copy(data, scratch / data.name)
            km = SandboxedKernelManager(policy=policy_for(path), scratch=scratch)
            try:
                NotebookClient(nb, km=km, timeout=cell_timeout, allow_errors=True).execute()
            except Exception as err:  # a kernel that died or a cell past its time: keep what was compiled
                log.warning("filling JAX's compilation cache: %s stopped: %s", path.name, err)
            finally:  # nbclient ends only a kernel whose manager it made itself; this one is ours
                if km.has_kernel:
                    run_sync(km.shutdown_kernel)(now=True)
            if (scratch / JAX_CACHE).is_dir():
                shutil.copytree(scratch / JAX_CACHE, target, dirs_exist_ok=True)
    return len(list(target.glob("*"))) if target.exists() else 0


def lend(cache: Path, scratch: Path, nb=None) -> None:
    """A private copy of the assignment's cache in a kernel's scratch folder, where the kernel looks
    (given the notebook: only if it imports JAX; a notebook that reaches JAX otherwise compiles all)."""
    if cache.is_dir() and (nb is None or uses_jax(nb)):
        shutil.copytree(cache, scratch / JAX_CACHE, dirs_exist_ok=True)
