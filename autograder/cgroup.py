"""A control group per sandbox: one bound on the memory of all its processes together, one on their number.

RLIMIT_AS bounds each process; a student who starts many (each under the cap) is bounded only by
their sum. A cgroup bounds the sum: memory (``memory.max`` in cgroup v2, ``memory.limit_in_bytes``
in v1; tmpfs pages count) and tasks (``pids.max``, threads included). The grader makes one below
its own cgroup where it may (root, or a delegated v2 subtree with both controllers enabled), and the
sandbox's first process joins it before anything of the student's runs; where it may not, the sandbox
keeps the per-process caps and its user's RLIMIT_NPROC (``sandbox.py``), and ``describe`` says so.
"""

from __future__ import annotations

import os
import secrets
import shlex
import signal
import time
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def _own_paths() -> dict[str, str]:
    """{controller (or "" for cgroup v2): this process's cgroup path} from /proc/self/cgroup."""
    paths = {}
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return paths
    for line in lines:
        _, controllers, path = line.split(":", 2)
        for name in controllers.split(",") if controllers else [""]:
            paths[name] = path
    return paths


def _v2_mount() -> Path | None:
    for candidate in (CGROUP_ROOT, CGROUP_ROOT / "unified"):
        if (candidate / "cgroup.controllers").is_file():
            return candidate
    return None


def _parents(memory_bytes: int, processes: int) -> list[tuple[Path, dict[str, str]]] | None:
    """(folder to make a child cgroup in, {file: value} to bound it) for memory and pids, or None."""
    own = _own_paths()
    v2 = _v2_mount()
    if v2 is not None and "" in own:
        parent = v2 / own[""].lstrip("/")
        try:
            enabled = (parent / "cgroup.subtree_control").read_text().split()
        except OSError:
            enabled = []
        if {"memory", "pids"} <= set(enabled):
            return [(parent, {"memory.max": str(memory_bytes), "memory.swap.max": "0", "pids.max": str(processes)})]
    if "memory" in own and "pids" in own:  # cgroup v1, a hierarchy per controller
        return [(CGROUP_ROOT / "memory" / own["memory"].lstrip("/"), {"memory.limit_in_bytes": str(memory_bytes)}),
                (CGROUP_ROOT / "pids" / own["pids"].lstrip("/"), {"pids.max": str(processes)})]
    return None


class SandboxCgroup:
    """The cgroup(s) of one sandbox; ``join_prefix`` goes in front of its command."""

    def __init__(self, folders: list[Path]):
        self.folders = folders

    @classmethod
    def create(cls, memory_bytes: int, processes: int) -> SandboxCgroup | None:
        """A new cgroup bounding memory and tasks, or None where this process may not make one."""
        parents = _parents(memory_bytes, processes)
        if parents is None:
            return None
        name = f"alibi-sandbox-{os.getpid()}-{secrets.token_hex(4)}"
        made = []
        try:
            for parent, limits in parents:
                folder = parent / name
                folder.mkdir()
                made.append(folder)
                for file, value in limits.items():
                    if (folder / file).exists():
                        (folder / file).write_text(value)
        except OSError:
            cls(made).close()
            return None
        return cls(made)

    def join_prefix(self) -> list[str]:
        """A command that puts itself in the cgroup(s), then becomes the rest of the command line."""
        joins = "; ".join(f"echo $$ > {shlex.quote(str(f / 'cgroup.procs'))} || exit 125" for f in self.folders)
        return ["/bin/sh", "-c", f'{joins}; exec "$@"', "sh"]

    def close(self) -> None:
        """Kill what is left in it and remove it."""
        for folder in self.folders:
            for _ in range(100):
                try:
                    pids = (folder / "cgroup.procs").read_text().split()
                except OSError:
                    pids = []
                for pid in pids:
                    try:
                        os.kill(int(pid), signal.SIGKILL)
                    except (ProcessLookupError, ValueError):
                        pass
                try:
                    folder.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:  # processes still exiting
                    time.sleep(0.02)


def describe() -> str:
    """What bounds a sandbox's processes together on this machine, in a sentence."""
    probe = SandboxCgroup.create(2**30, 64)
    if probe is None:
        return ("no cgroup this grader may make: each process's memory is capped (RLIMIT_AS) and the sandbox's "
                "user has an RLIMIT_NPROC, but not the memory of all its processes together")
    kind = "v2" if _v2_mount() is not None and len(probe.folders) == 1 else "v1"
    probe.close()
    return f"a cgroup ({kind}) per sandbox bounds the memory of all its processes together and their number"
