"""One sandbox per student and view, and a kernel zygote in it: heavy imports paid once, not per notebook.

Starting a kernel costs about 0.5 s, and the notebooks' first cells import numpy, torch and
matplotlib (about 1.5 s more): every notebook paid both. Now each student's job starts one
sandbox (``sandbox.sandbox_prefix``, the same bubblewrap policy and memory limit) running a
zygote (``_zygote_server.py``) that imports the kernel and the course's heavy modules once; each
notebook's kernel is a fork of it: a fresh process, in its own session, its own scratch folder,
with nothing of the previous notebook's state. The grader drives it over the zygote's own standard
input and output, pipes that no kernel holds (a fork closes them before it runs a cell): nothing in
the sandbox can ask it for a process, and it is not dumpable, so a kernel of the same user cannot
trace it or reach its descriptors through /proc. What changes against a sandbox per notebook: a process one of the
student's notebooks leaves running lives until the student's last notebook is graded (then the
sandbox ends and takes it along), where before it ended with its notebook. The notebooks (and second runs,
``execute.SandboxedExecute.run_again``) that see one view of the course's reference (``view.py``) share its
zygote; a run lent the reference's upstream answers gets a sandbox of its own. Every other
guarantee (no network, nothing of the course or other students visible, the memory cap per
kernel, the time limits) holds as before.

Which modules to preload is the course's choice (``SandboxedExecute.preload`` in its
nbgrader_config.py); a zygote that cannot start, or that a student's code killed, is replaced
by a new one, or the notebook gets a kernel of its own as before.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from .cgroup import SandboxCgroup
from .sandbox import SandboxPolicy, hand_over, kernel_env, new_scratch, sandbox_prefix, sandbox_user

SERVER = Path(__file__).with_name("_zygote_server.py")
# what of a kernel's environment is its own notebook's (kernel_env): all a spawn request may set in a fork
PER_NOTEBOOK = ("HOME", "MPLCONFIGDIR", "IPYTHONDIR", "JAX_COMPILATION_CACHE_DIR")
START_TIMEOUT = 120  # seconds for the zygote's imports (torch on a loaded machine: a few)


class ZygoteError(RuntimeError):
    pass


class Zygote:
    """A student's sandbox with a zygote in it (see the module docstring)."""

    def __init__(self, policy: SandboxPolicy, preload: list[str]):
        # the student's folder is the grader's (0711): the sandbox's user writes only in the folders handed to it,
        # the zygote's home and each kernel's (``scratch``)
        self.root = new_scratch("student")
        self.uid = sandbox_user()
        self.cgroup = SandboxCgroup.create(policy.sandbox_memory_bytes, policy.processes)
        self._lock = threading.Lock()
        home = self.root / "zygote"
        home.mkdir()
        hand_over(home, self.uid)
        cmd = [*sandbox_prefix(policy, self.root, self.uid, self.cgroup), sys.executable, "-c", SERVER.read_text(),
               ",".join(PER_NOTEBOOK), *preload]
        # the zygote's log, outside the sandbox: nothing of the student's can stand in its place
        self._log = tempfile.TemporaryFile()
        env = kernel_env(home, policy)  # the kernels it forks keep what is not theirs alone (PER_NOTEBOOK)
        self.process = subprocess.Popen(cmd, cwd=home, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=self._log, start_new_session=True)
        try:
            ready = self._reply(START_TIMEOUT)
        except ZygoteError as err:
            self._log.seek(0)
            words = self._log.read()[-300:].decode(errors="replace").strip()
            self.close()
            raise ZygoteError(f"the kernel zygote did not start ({err}): {words or 'no output'}") from None
        if ready.get("ready") is not True:
            self.close()
            raise ZygoteError(f"the kernel zygote did not start: it said {ready!r}")

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def request(self, **message) -> dict:
        """One request and its reply, over the zygote's standard input and output (one at a time: the grader's
        threads share a zygote's pipes)."""
        with self._lock:
            try:
                self.process.stdin.write((json.dumps(message) + "\n").encode())
                self.process.stdin.flush()
            except (OSError, ValueError) as err:
                raise ZygoteError(f"the kernel zygote is gone ({err})") from err
            return self._reply(30)

    def _reply(self, timeout: float) -> dict:
        ready, _, _ = select.select([self.process.stdout], [], [], timeout)
        if not ready:
            raise ZygoteError(f"no reply within {timeout} s")
        line = self.process.stdout.readline(2**16)
        if not line:
            raise ZygoteError("the kernel zygote is gone (no reply)")
        return json.loads(line)

    def spawn(self, connection_file: Path, scratch: Path) -> ZygoteProcess:
        """A kernel forked for one notebook, as jupyter_client's provisioner holds a kernel's Popen."""
        # a kernel of its own would get kernel_env(scratch); what of it is per notebook, this one gets too
        env = {name: kernel_env(scratch)[name] for name in PER_NOTEBOOK}
        pid = self.request(op="spawn", connection_file=str(connection_file), cwd=str(scratch),
                           log=str(scratch / "kernel.log"), env=env)["pid"]
        return ZygoteProcess(self, pid)

    def scratch(self) -> Path:
        """A fresh folder for one notebook's kernel, inside the student's sandbox."""
        return Path(tempfile.mkdtemp(prefix="kernel-", dir=self.root))

    def close(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)  # bwrap, and with it everything in the sandbox
            self.process.wait()
        for pipe in (self.process.stdin, self.process.stdout):
            with contextlib.suppress(OSError):  # a request written that the zygote never read
                pipe.close()
        self._log.close()
        if self.cgroup is not None:
            self.cgroup.close()
        shutil.rmtree(self.root, ignore_errors=True)


class ZygoteProcess:
    """What jupyter_client's provisioner expects of a kernel's Popen, for a kernel forked by the zygote."""

    stdin = stdout = stderr = None

    def __init__(self, zygote: Zygote, pid: int):
        self.zygote, self.pid, self.returncode = zygote, pid, None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                self.returncode = self.zygote.request(op="poll", pid=self.pid)["exit"]
            except ZygoteError:
                self.returncode = -signal.SIGKILL  # the sandbox is gone, and every kernel in it
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"kernel {self.pid}", timeout)
            time.sleep(0.02)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            try:
                self.zygote.request(op="signal", pid=self.pid, signal=int(signum))
            except ZygoteError:
                pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


# one zygote per student's assignment being graded in this process, and view of the course's reference it binds
_ZYGOTES: dict[tuple, Zygote] = {}


def zygote_for(key: tuple, policy: SandboxPolicy, preload: list[str]) -> Zygote:
    """The zygote for ``key`` (student, assignment, view), started (or restarted, if a notebook killed it) as
    needed."""
    current = _ZYGOTES.get(key)
    if current is not None and current.alive:
        return current
    if current is not None:
        current.close()
    _ZYGOTES[key] = Zygote(policy, preload)
    return _ZYGOTES[key]


def close_zygote(job: tuple) -> None:
    """End this student's sandboxes (every key that starts with ``job``: student, assignment), at the end of their
    job (other jobs' zygotes, in other threads of a Dask worker, stay)."""
    for key in [key for key in list(_ZYGOTES) if key[:len(job)] == job]:  # list(): one step, as other threads add
        zygote = _ZYGOTES.pop(key, None)
        if zygote is not None:
            zygote.close()
