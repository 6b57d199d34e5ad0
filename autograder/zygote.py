"""One sandbox per student, and a kernel zygote in it: heavy imports paid once per student, not per notebook.

Starting a kernel costs about 0.5 s, and the notebooks' first cells import numpy, torch and
matplotlib (about 1.5 s more): every notebook paid both. Now each student's job starts one
sandbox (``sandbox.sandbox_prefix``, the same bubblewrap policy and memory limit) running a
zygote (``_zygote_server.py``) that imports the kernel and the course's heavy modules once; each
notebook's kernel is a fork of it: a fresh process, in its own session, its own scratch folder,
with nothing of the previous notebook's state. The grader drives it over a unix socket in the
student's scratch folder. What changes against a sandbox per notebook: a process one of the
student's notebooks leaves running lives until the student's last notebook is graded (then the
sandbox ends and takes it along), where before it ended with its notebook. Every other
guarantee (no network, nothing of the course or other students visible, the memory cap per
kernel, the time limits) holds as before.

Which modules to preload is the course's choice (``SandboxedExecute.preload`` in its
nbgrader_config.py); a zygote that cannot start, or that a student's code killed, is replaced
by a new one, or the notebook gets a kernel of its own as before.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from alibi_ref.course.checks import GRADING_ENV

from .sandbox import SandboxPolicy, kernel_env, new_scratch, sandbox_prefix

SERVER = Path(__file__).with_name("_zygote_server.py")
START_TIMEOUT = 120  # seconds for the zygote's imports (torch on a loaded machine: a few)


class ZygoteError(RuntimeError):
    pass


class Zygote:
    """A student's sandbox with a zygote in it (see the module docstring)."""

    def __init__(self, policy: SandboxPolicy, preload: list[str]):
        self.root = new_scratch("student")
        self.socket = self.root / "zygote.sock"
        cmd = [*sandbox_prefix(policy, self.root), sys.executable, "-c", SERVER.read_text(), str(self.socket),
               *preload]
        with open(self.root / "zygote.log", "ab") as log:
            # the zygote grades nothing: GRADING_ENV goes to each kernel (the checks' audit hook, imported
            # here, takes a process with it set for one that runs answers, and refuses it to fork)
            env = {name: value for name, value in kernel_env(self.root).items() if name != GRADING_ENV}
            self.process = subprocess.Popen(cmd, cwd=self.root, env=env, stdin=subprocess.DEVNULL,
                                            stdout=log, stderr=log, start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT
        while not self.socket.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                words = (self.root / "zygote.log").read_text(errors="replace").strip()[-300:]
                self.close()
                raise ZygoteError(f"the kernel zygote did not start: {words or 'no output'}")
            time.sleep(0.02)

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def request(self, **message) -> dict:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(30)
            try:
                conn.connect(str(self.socket))
                conn.sendall((json.dumps(message) + "\n").encode())
                reply = conn.makefile("r").readline()
            except OSError as err:
                raise ZygoteError(f"the kernel zygote is gone ({err})") from err
        if not reply:
            raise ZygoteError("the kernel zygote is gone (no reply)")
        return json.loads(reply)

    def spawn(self, connection_file: Path, scratch: Path, secret: str = "") -> int:
        # a kernel of its own would get kernel_env(scratch, secret); what of it is per notebook, this one gets too
        per_notebook = ("HOME", "MPLCONFIGDIR", "IPYTHONDIR", "JAX_COMPILATION_CACHE_DIR", GRADING_ENV)
        env = {name: kernel_env(scratch, secret)[name] for name in per_notebook}
        return self.request(op="spawn", connection_file=str(connection_file), cwd=str(scratch),
                            log=str(scratch / "kernel.log"), env=env)["pid"]

    def scratch(self) -> Path:
        """A fresh folder for one notebook's kernel, inside the student's sandbox."""
        return Path(tempfile.mkdtemp(prefix="kernel-", dir=self.root))

    def close(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)  # bwrap, and with it everything in the sandbox
            self.process.wait()
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


# one zygote per student's assignment being graded in this process
_ZYGOTES: dict[tuple, Zygote] = {}


def zygote_for(key: tuple, policy: SandboxPolicy, preload: list[str]) -> Zygote:
    """The zygote of this student's job, started (or restarted, if a notebook killed it) as needed."""
    current = _ZYGOTES.get(key)
    if current is not None and current.alive:
        return current
    if current is not None:
        current.close()
    _ZYGOTES[key] = Zygote(policy, preload)
    return _ZYGOTES[key]


def close_zygote(key: tuple) -> None:
    """End this student's sandbox, at the end of their job (other jobs' zygotes, in other threads of a
    Dask worker, stay)."""
    zygote = _ZYGOTES.pop(key, None)
    if zygote is not None:
        zygote.close()
