"""A control group per sandbox: one bound on the memory of all its processes together, one on their number.

RLIMIT_AS bounds each process; a student who starts many (each under the cap) is bounded only by
their sum. A cgroup bounds the sum: memory (``memory.max`` in cgroup v2, ``memory.limit_in_bytes``
in v1; tmpfs pages count) and tasks (``pids.max``, threads included). The grader makes one below
its own cgroup where it may (root, or a delegated v2 subtree with both controllers enabled), and the
sandbox's first process joins it before anything of the student's runs; where it may not, the sandbox
keeps the per-process caps and its user's RLIMIT_NPROC (``sandbox.py``), and ``describe`` says so (a warning
when grading starts). The same cgroup measures how far a sandbox's memory rises while a test cell runs
(``MemoryMeter``), for checks that bound an answer's memory.
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


Limits = dict[str, str]  # {cgroup file: value}


def _parents(v2_limits: Limits, v1_limits: dict[str, Limits]) -> list[tuple[Path, Limits]] | None:
    """(folder to make a child cgroup in, {file: value} to bound it): one folder under cgroup v2 where its
    controllers (each file's prefix) are enabled below this process's cgroup, else one per cgroup v1 controller
    (``v1_limits``' keys); None where neither is."""
    own = _own_paths()
    v2 = _v2_mount()
    if v2 is not None and "" in own:
        parent = v2 / own[""].lstrip("/")
        try:
            enabled = (parent / "cgroup.subtree_control").read_text().split()
        except OSError:
            enabled = []
        if {file.split(".")[0] for file in v2_limits} <= set(enabled):
            return [(parent, v2_limits)]
    if all(controller in own for controller in v1_limits):  # cgroup v1, a hierarchy per controller
        return [(CGROUP_ROOT / controller / own[controller].lstrip("/"), limits)
                for controller, limits in v1_limits.items()]
    return None


class SandboxCgroup:
    """The cgroup(s) of one sandbox; ``join_prefix`` goes in front of its command."""

    def __init__(self, folders: list[Path]):
        self.folders = folders

    @classmethod
    def create(cls, memory_bytes: int, processes: int) -> SandboxCgroup | None:
        """A new cgroup bounding memory and tasks, or None where this process may not make one."""
        return cls._made(_parents(
            {"memory.max": str(memory_bytes), "memory.swap.max": "0", "pids.max": str(processes)},
            {"memory": {"memory.limit_in_bytes": str(memory_bytes)}, "pids": {"pids.max": str(processes)}}))

    @classmethod
    def cpu_share(cls, fraction: float) -> SandboxCgroup | None:
        """A new cgroup whose processes together get ``fraction`` of one CPU, however idle the machine: a busy
        machine made to measure (the tests' and benchmarks' load), or None where this process may not make one."""
        period = 100_000
        quota = max(1000, int(fraction * period))
        return cls._made(_parents({"cpu.max": f"{quota} {period}"},
                                  {"cpu": {"cpu.cfs_period_us": str(period), "cpu.cfs_quota_us": str(quota)}}))

    @classmethod
    def _made(cls, parents: list[tuple[Path, Limits]] | None) -> SandboxCgroup | None:
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

    def memory_meter(self) -> MemoryMeter | None:
        """A meter of how far the memory of the sandbox's processes together rises from now on, or None where the
        cgroup cannot restart its peak (none bounds memory; cgroup v2 before Linux 6.12)."""
        for folder in self.folders:
            if (folder / "memory.max_usage_in_bytes").exists() or (folder / "memory.peak").exists():
                try:
                    return MemoryMeter(folder)
                except OSError:
                    return None
        return None

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


class MemoryMeter:
    """How far a cgroup's memory (its processes', tmpfs pages included) rose above what it was at the start: the
    kernel's own accounting, read from outside the sandbox, which nothing inside can stop or change. cgroup v1
    restarts ``memory.max_usage_in_bytes`` at the current usage on a write; v2 restarts ``memory.peak`` for the
    descriptor that writes to it."""

    def __init__(self, folder: Path):
        self.v1 = (folder / "memory.max_usage_in_bytes").exists()
        self.start = int((folder / ("memory.usage_in_bytes" if self.v1 else "memory.current")).read_text())
        self._peak = os.open(folder / ("memory.max_usage_in_bytes" if self.v1 else "memory.peak"), os.O_RDWR)
        try:
            os.write(self._peak, b"0\n" if self.v1 else b"reset\n")
        except OSError:
            os.close(self._peak)
            raise

    def rise(self) -> int:
        """Bytes the peak since the start lies above the usage then; the meter closes."""
        try:
            return max(0, int(os.pread(self._peak, 64, 0)) - self.start)
        finally:
            os.close(self._peak)


def describe() -> tuple[str, bool]:
    """What bounds a sandbox's processes together on this machine, in a sentence, and whether it is all of it: a
    cgroup that bounds their memory and number and measures how far their memory rises."""
    probe = SandboxCgroup.create(2**30, 64)
    if probe is None:
        return ("no cgroup this grader may make: each process's memory is capped (RLIMIT_AS) and the sandbox's "
                "user has an RLIMIT_NPROC, but not the memory of all its processes together; a check that bounds an "
                "answer's memory reads what the kernel says"), False
    kind = "v2" if _v2_mount() is not None and len(probe.folders) == 1 else "v1"
    meter = probe.memory_meter()
    if meter is not None:
        meter.rise()
    probe.close()
    measured = ("and how far it rises while a test cell runs is measured for checks that bound an answer's memory"
                if meter is not None else "but it cannot restart its peak here, so a check that bounds an answer's "
                "memory reads what the kernel says")
    return (f"a cgroup ({kind}) per sandbox bounds the memory of all its processes together and their number, "
            f"{measured}"), meter is not None
