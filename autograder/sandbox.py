"""Where a student's kernel runs: inside bubblewrap, as a user of its own, with no network and a private folder.

The sandbox starts from an empty root and binds in, read-only, only what a Python kernel
needs: the system's programs and libraries (/usr, /bin, /lib...), a few harmless files of
/etc, the Python installation, the virtual environment, and the course's view of its own package
(``SandboxPolicy.view``: for this course the checks and only the helpers the notebook's answers may
use, never the reference) with the cases' inputs (``SandboxPolicy.cases``). Nothing
else of the machine exists inside: not the course with its solutions and hidden tests, not
the gradebook, not the grading output, not any other submission, wherever they lie. One
scratch folder per notebook is bound writable; the kernel runs there. It has its own network
namespace (no network) and PID namespace (no process it starts outlives it), and its memory
is capped with RLIMIT_AS (prlimit). What it may write is bounded too: its /tmp and /dev/shm
are tmpfs of a fixed size (tmpfs pages are memory that RLIMIT_AS does not count: unbounded,
writing a file there took the machine's memory), the rest of /dev is read-only, no file it
writes may grow past RLIMIT_FSIZE, and its scratch folder (on the grader's own disk) is looked
at while a cell runs: past its size or file count the kernel is stopped.

What it may do is bounded by who it is, not only by what it sees. Where the grader is root, bwrap
starts without a user namespace and keeps only the capabilities to change user, and ``setpriv``
then makes everything in the sandbox a user of its own (a uid no account and no file of the
machine has, ``sandbox_user``) with no capability left, even in the bounding set: it cannot
remount a read-only bind, and RLIMIT_NPROC bounds its processes and threads. Its folders are
handed to that user only once the grader has written all it writes there (``hand_over``), so a
file the student's code plants cannot redirect a write of the grader's. A cgroup per sandbox
bounds the memory of all its processes together (``cgroup.py``), where the grader may make one.
A seccomp filter (``no_user_namespaces_filter``, made with libseccomp) refuses every new user
namespace inside: the kernel's code for them is attack surface a sandboxed process has no use for.

Where bubblewrap is missing (or cannot create namespaces) the kernel runs unsandboxed with
the same limits and scratch folder, after a warning: a weaker fallback for trusted classes.
"""

from __future__ import annotations

import atexit
import errno
import importlib.util
import os
import re
import secrets
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from queue import Empty

from jupyter_client.asynchronous import AsyncKernelClient
from jupyter_client.kernelspec import KernelSpec
from jupyter_client.manager import AsyncKernelManager
from traitlets import Instance

from .cgroup import SandboxCgroup, describe
from .screen import MODULES

# what a kernel needs from the system, read-only; /etc only in part (no shadow, no keys)
SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/sys")
ETC_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives", "/etc/localtime",
             "/etc/fonts", "/etc/mime.types", "/etc/passwd", "/etc/group", "/etc/nsswitch.conf")


@dataclass(frozen=True)
class SandboxPolicy:
    """What the kernel may see, and its limits."""

    memory_bytes: int = 3 * 2**30
    use_bwrap: bool = True
    tmp_bytes: int = 512 * 2**20  # the size of each of its tmpfs, /tmp and /dev/shm
    file_bytes: int = 2**30  # the most any one file it writes may hold
    disk_bytes: int = 2 * 2**30  # the most its scratch folder may hold, all files together, looked at each second
    disk_files: int = 100_000  # and the most files and folders in it
    processes: int = 512  # processes and threads of the whole sandbox (JAX starts about 60 on 16 cores)
    view: str | None = None  # a folder of packages, each bound in place of the installed package of its name
    cases: str | None = None  # a file the course's checks read, bound read-only at ``cases_path``
    cases_path: str = "/grading/cases.json"
    env: tuple[tuple[str, str], ...] = ()  # the course's variables in every kernel's environment

    @property
    def sandbox_memory_bytes(self) -> int:
        """All its processes together, tmpfs included: one kernel at its cap, and both of its tmpfs full."""
        return self.memory_bytes + 2 * self.tmp_bytes


# the uids sandboxes run as where the grader is root: above any account's (Debian's go to 60000, and
# systemd's dynamic users to 65519) and below 2**31, which some tools read as signed
FIRST_SANDBOX_UID, LAST_SANDBOX_UID = 2**30, 2**31 - 2


def sandbox_user() -> int | None:
    """A uid of its own for one sandbox where the grader is root, else None (the sandbox is the grader's
    user, in a user namespace of its own, without capabilities)."""
    if os.geteuid() != 0 or user_switch_problem():
        return None
    return FIRST_SANDBOX_UID + secrets.randbelow(LAST_SANDBOX_UID - FIRST_SANDBOX_UID)


def hand_over(folder: Path, uid: int | None) -> None:
    """Give ``folder`` and what the grader wrote in it to the sandbox's user, once the grader will write there
    no more: before, the folder is the grader's alone, and nothing the student's code does can redirect a
    write of the grader's (a link planted where it writes)."""
    if uid is None:
        return
    os.lchown(folder, uid, uid)
    _traversable(folder)  # for bwrap's --chdir, made as root without a capability before the switch
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            os.lchown(os.path.join(root, name), uid, uid)


def _traversable(folder: Path) -> None:
    """Let the sandbox's user reach ``folder`` (to bind it) without reading or writing it: mode 0711."""
    os.chmod(folder, stat.S_IRWXU | stat.S_IXGRP | stat.S_IXOTH)


# a scratch folder's name carries the process that made it: alibi-KIND-PID-STARTTIME-random
_SCRATCH_NAME = re.compile(r"alibi-(student|kernel)-(?P<pid>\d+)-(?P<start>\d+)-[^/]+")


def _process_tag(pid: int) -> str | None:
    """pid and its start time (clock ticks since boot, from /proc), which a reused pid does not share;
    None where no such process runs."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None if sys.platform == "linux" else f"{pid}-0"
    return f"{pid}-{stat.rsplit(')', 1)[1].split()[19]}"  # field 22, counted after the command's name


def new_scratch(kind: str) -> Path:
    """A folder of the grader's (0711: the sandbox's user may pass through it, not list or write it) for a
    student's sandbox or one kernel, named for the process that made it, after removing what graders killed
    before they could clean up left behind (``sweep_scratch``)."""
    sweep_scratch()
    folder = Path(tempfile.mkdtemp(prefix=f"alibi-{kind}-{_process_tag(os.getpid())}-"))
    _traversable(folder)
    return folder


def sweep_scratch(where: Path | None = None) -> list[Path]:
    """Remove this user's scratch folders whose process is gone (a grader killed by a signal or the OOM
    killer leaves the students' code and outputs behind); returns them. The name decides, not a file
    inside, which the student's code could write."""
    removed = []
    for entry in os.scandir(where or tempfile.gettempdir()):
        match = _SCRATCH_NAME.fullmatch(entry.name)
        if match is None or not entry.is_dir(follow_symlinks=False):
            continue
        if entry.stat(follow_symlinks=False).st_uid != os.getuid():
            continue  # another user's grader
        if _process_tag(int(match["pid"])) != f"{match['pid']}-{match['start']}":
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(Path(entry.path))
    return removed


@lru_cache(maxsize=1)
def bwrap_problem() -> str | None:
    """None if bubblewrap can sandbox here, else why not."""
    path = shutil.which("bwrap")
    if path is None:
        return "bubblewrap (bwrap) is not installed: `apt-get install bubblewrap`"
    # what the sandbox needs of it: namespaces, and a tmpfs of a bounded size (--size, bubblewrap 0.5 or later)
    probe = subprocess.run([path, "--ro-bind", "/", "/", "--size", "1048576", "--tmpfs", "/tmp", "--unshare-all",
                            "--die-with-parent", "--cap-drop", "ALL", "true"], capture_output=True, text=True,
                           check=False)
    if probe.returncode != 0:
        return ("bwrap cannot sandbox here (it needs namespaces, and bubblewrap 0.5 or later to bound a tmpfs): "
                f"{probe.stderr.strip() or probe.returncode}")
    return None


def _switch_user(uid: int) -> list[str]:
    """Run inside the sandbox as root (bwrap without a user namespace, which kept only what this needs): become
    ``uid`` for good, every capability gone, even from the bounding set, and no way back (no_new_privs)."""
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--inh-caps=-all",
            "--bounding-set=-all", "--no-new-privs", "--"]


@lru_cache(maxsize=1)
def user_switch_problem() -> str | None:
    """None where a root grader's sandbox can switch to a user of its own (``_switch_user``) and still run this
    Python, else why not."""
    if shutil.which("setpriv") is None:
        return "setpriv (util-linux) is missing"
    scratch = new_scratch("kernel")
    try:
        command = [*sandbox_prefix(SandboxPolicy(), scratch, FIRST_SANDBOX_UID), sys.executable, "-c", "pass"]
        probe = subprocess.run(command, capture_output=True, text=True, check=False)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if probe.returncode != 0:
        return f"a sandbox user cannot run this Python in bwrap: {probe.stderr.strip()[-300:] or probe.returncode}"
    return None


def warn_if_unsandboxed(policy: SandboxPolicy) -> None:
    if not policy.use_bwrap:
        warnings.warn("sandbox disabled (--sandbox none): student code runs with the grader's rights",
                      stacklevel=2)
    elif problem := bwrap_problem():
        warnings.warn(f"NO SANDBOX: {problem}. Student kernels will run with the grader's rights, limited only "
                      "by a private working folder, a memory limit and a time limit. Grade only code you trust.",
                      stacklevel=2)
    else:
        sentence, complete = describe()
        if not complete:
            warnings.warn(f"sandboxes without a full cgroup: {sentence}", stacklevel=2)
        if no_user_namespaces_filter() is None:
            warnings.warn("no seccomp filter (pyseccomp and libseccomp are needed): kernels may make user "
                          "namespaces of their own", stacklevel=2)


CLONE_NEWUSER = 0x10000000


@lru_cache(maxsize=1)
def no_user_namespaces_filter() -> str | None:
    """The path of a seccomp program (for bwrap's ``--seccomp``) that refuses ``unshare`` and ``clone`` asking for
    a new user namespace, and ``clone3`` (its flags lie in memory no filter reads; glibc then calls ``clone``).
    None where libseccomp or its binding is missing (grading then warns)."""
    try:
        import pyseccomp as seccomp

        program = seccomp.SyscallFilter(seccomp.ALLOW)
        for call in ("unshare", "clone"):
            program.add_rule(seccomp.ERRNO(errno.EPERM), call,
                             seccomp.Arg(0, seccomp.MASKED_EQ, CLONE_NEWUSER, CLONE_NEWUSER))
        program.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")
        folder = tempfile.mkdtemp(prefix="alibi-seccomp-")
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        path = os.path.join(folder, "no-user-namespaces.bpf")
        with open(path, "wb") as out:
            program.export_bpf(out)
        return path
    except (ImportError, OSError, RuntimeError, ValueError):
        return None


def _python_roots() -> list[str]:
    """Folders the kernel's Python needs: the venv, the base installation and the packages' folders
    (site-packages that a .pth file adds from elsewhere). Never a checkout, with its solutions."""
    packages = {p for p in sys.path if Path(p).name in ("site-packages", "dist-packages") and Path(p).is_dir()}
    return sorted({sys.prefix, sys.base_prefix, *packages})


def view_binds(view: str | None) -> list[tuple[str, str]]:
    """(source, where) for each package folder in ``view``: bound where Python finds the installed package of
    that name (in site-packages, or the checkout an editable install serves it from), so that the kernel
    imports the view's files and sees nothing else of the package."""
    binds = []
    for folder in sorted(Path(view).iterdir()) if view else ():
        spec = importlib.util.find_spec(folder.name)  # the package's folder, without importing it
        if spec is not None and spec.submodule_search_locations:
            binds.append((str(folder), str(Path(next(iter(spec.submodule_search_locations))).resolve())))
    return binds


def sandbox_prefix(policy: SandboxPolicy, scratch: Path, uid: int | None = None, cgroup=None) -> list[str]:
    """The command that goes in front of the kernel's own command: join the sandbox's cgroup (``cgroup.py``),
    start bwrap, become the sandbox's user ``uid`` (``sandbox_user``), set the per-process limits."""
    limit = (["prlimit", f"--as={policy.memory_bytes}", f"--fsize={policy.file_bytes}",
              f"--nproc={policy.processes}", "--"] if shutil.which("prlimit") else [])
    join = cgroup.join_prefix() if cgroup is not None else []
    if not sandboxed(policy):
        return join + limit
    if uid is not None:  # root: namespaces but no user namespace, so that setpriv can become ``uid`` inside
        namespaces = ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try",
                      "--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID",
                      "--cap-add", "CAP_SETPCAP"]
    elif os.geteuid() == 0:  # root that cannot switch: uid 65534 of a user namespace, without a capability
        namespaces = ["--unshare-all", "--unshare-user", "--uid", "65534", "--gid", "65534", "--cap-drop", "ALL"]
    else:  # an unprivileged grader: bwrap's user namespace has no capability to drop, and drops them all
        namespaces = ["--unshare-all", "--cap-drop", "ALL"]
    tmpfs = ["--size", str(policy.tmp_bytes), "--perms", "1777", "--tmpfs"]
    seccomp = no_user_namespaces_filter()
    # bwrap reads the filter from a descriptor: the shell opens it as 9, then becomes bwrap
    start = ["sh", "-c", 'exec 9<"$0" && exec "$@"', seccomp, "bwrap", "--seccomp", "9"] if seccomp else ["bwrap"]
    cmd = [*join, *start, "--tmpfs", "/", "--dev", "/dev", *tmpfs, "/dev/shm", "--proc", "/proc", *tmpfs, "/tmp",
           "--perms", "1777", "--dir", "/var/tmp"]
    made = {"/", "/tmp", "/dev"}
    binds = [(p, p) for p in (*SYSTEM_PATHS, *ETC_FILES, *sorted(_python_roots(), key=len), str(scratch))
             if os.path.lexists(p)]
    binds += view_binds(policy.view) + ([(policy.cases, policy.cases_path)] if policy.cases else [])
    for source, path in binds:
        # the folders on the way, made in the sandbox's root traversable: bwrap would copy their modes (/root: 0700)
        for folder in reversed(Path(path).parents):
            if str(folder) not in made:
                made.add(str(folder))
                cmd += ["--perms", "0755", "--dir", str(folder)]
        cmd += ["--bind" if path == str(scratch) else "--ro-bind", source, path]
    cmd += ["--chdir", str(scratch), *namespaces, "--die-with-parent", "--new-session",
            "--remount-ro", "/", "--remount-ro", "/dev", "--"]
    return cmd + (_switch_user(uid) if uid is not None else []) + limit


def over_bounds(folder: Path, policy: SandboxPolicy) -> str | None:
    """Why ``folder`` holds more than the policy allows (bytes on disk, or files and folders), or None."""
    size, count, todo = 0, 0, [folder]
    while todo:
        try:
            entries = list(os.scandir(todo.pop()))
        except OSError:  # removed while being looked at
            continue
        for entry in entries:
            count += 1
            if count > policy.disk_files:
                return f"it made more than {policy.disk_files:,} files and folders in its folder"
            try:
                size += entry.stat(follow_symlinks=False).st_blocks * 512
                if entry.is_dir(follow_symlinks=False):
                    todo.append(entry.path)
            except OSError:
                continue
            if size > policy.disk_bytes:
                return f"it wrote more than {policy.disk_bytes / 2**20:,.0f} MiB into its folder"
    return None


class SandboxedKernelClient(AsyncKernelClient):
    """jupyter_client's client, ready as soon as the kernel answers on both channels."""

    async def _async_wait_for_ready(self, timeout: float | None = None) -> None:
        # jupyter_client's own wait ends by listening until IOPub has been silent for 0.2 s, to drain the
        # kernel's start-up messages: a fixed 0.2 s per notebook. nbclient reads only the replies to its
        # own requests (by parent message id), so the start-up messages need no draining.
        deadline = time.monotonic() + (float("inf") if timeout is None else timeout)
        while True:
            self.kernel_info()
            try:
                reply = await self.shell_channel.get_msg(timeout=1)
            except Empty:
                reply = None
            if reply is not None and reply["msg_type"] == "kernel_info_reply":
                try:  # IOPub connected: the kernel's status messages reach it
                    await self.iopub_channel.get_msg(timeout=0.2)
                except Empty:
                    pass
                else:
                    self._handle_kernel_info_reply(reply)
                    return
            if not await self._async_is_alive():
                raise RuntimeError("Kernel died before replying to kernel_info")
            if time.monotonic() > deadline:
                raise RuntimeError(f"Kernel didn't respond in {timeout:.0f} seconds")

    wait_for_ready = _async_wait_for_ready  # what AsyncKernelClient calls by this name


class SandboxedKernelManager(AsyncKernelManager):
    """A python3 kernel started inside the sandbox, talking over unix sockets in its scratch folder.

    TCP would not reach a kernel in its own network namespace; unix sockets in a bound folder do.
    Interrupts go as messages: a signal would reach bwrap, not the kernel.
    """

    policy = Instance(SandboxPolicy)
    scratch = Instance(Path)
    zygote = Instance("autograder.zygote.Zygote", allow_none=True)

    def __init__(self, *, policy: SandboxPolicy, scratch: Path, zygote=None, **kwargs):
        super().__init__(policy=policy, scratch=scratch, zygote=zygote, kernel_name="python3",
                         transport="ipc",
                         ip=str(scratch / "kernel"), connection_file=str(scratch / "kernel.json"),
                         autorestart=False, client_class="autograder.sandbox.SandboxedKernelClient", **kwargs)

    @property
    def kernel_spec(self) -> KernelSpec:
        if self._kernel_spec is None:
            # parent_handle=0: the kernel's parent is the sandbox's init, not the grader, and ipykernel
            # would take that for an orphaned kernel and exit; --die-with-parent ends it with the grader
            argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}",
                    "--IPKernelApp.parent_handle=0"]
            self._kernel_spec = KernelSpec(argv=argv, display_name="Python 3 (sandboxed)", language="python",
                                           interrupt_mode="message")
        return self._kernel_spec

    uid = None  # the sandbox's user (``sandbox_user``), its cgroup: a kernel of its own makes its own
    cgroup = None

    @property
    def sandbox_cgroup(self) -> SandboxCgroup | None:
        """The cgroup the kernel runs in: its zygote's, or its own."""
        return self.zygote.cgroup if self.zygote is not None else self.cgroup

    def format_kernel_cmd(self, extra_arguments=None):
        if self.zygote is None and self.uid is None:
            self.uid = sandbox_user()
            self.cgroup = SandboxCgroup.create(self.policy.sandbox_memory_bytes, self.policy.processes)
        prefix = sandbox_prefix(self.policy, self.scratch, self.uid, self.cgroup)
        return prefix + super().format_kernel_cmd(extra_arguments)

    async def _async_cleanup_resources(self, restart: bool = False) -> None:
        await super()._async_cleanup_resources(restart=restart)
        if self.cgroup is not None:
            self.cgroup.close()
            self.cgroup = None

    cleanup_resources = _async_cleanup_resources  # what AsyncKernelManager calls by this name

    async def _async_is_alive(self) -> bool:
        """Alive, and within its folder's bounds: the scratch folder lies on the grader's disk, where the
        size cap of each file does not bound how many it writes. nbclient asks about once a second while a
        cell runs; a kernel past the bounds is killed then, and ``stopped_for`` says why."""
        if not await super()._async_is_alive():
            return False
        folder = self.zygote.root if self.zygote is not None else self.scratch
        why = over_bounds(folder, self.policy)
        if why is None:
            return True
        self.stopped_for = why
        await self._async_kill_kernel()
        return False

    is_alive = _async_is_alive  # what AsyncKernelManager and the client call by this name

    async def _async_wait(self, pollinterval: float = 0.01) -> None:
        # jupyter_client looks every 0.1 s whether the kernel has ended; a killed one ends within milliseconds
        await super()._async_wait(pollinterval=pollinterval)

    async def _async_launch_kernel(self, kernel_cmd, **kw):
        write_startup(self.scratch)
        if self.zygote is not None:  # a fork of the student's zygote, inside its sandbox (zygote.py)
            hand_over(self.scratch, self.zygote.uid)
            self.provisioner.process = self.zygote.spawn(Path(self.connection_file), self.scratch)
            self.provisioner.pid, self.provisioner.pgid = self.provisioner.process.pid, None
            self._reconcile_connection_info(self.provisioner.connection_info)
            return
        kw["cwd"] = str(self.scratch)
        kw["env"] = kernel_env(self.scratch, self.policy)
        # the kernel's own chatter goes to a log, read back if it dies
        kw["stdout"] = subprocess.DEVNULL
        # the process keeps it open; made here, so no file of the student's stands in its place
        kw["stderr"] = os.fdopen(os.open(self.scratch / "kernel.log", os.O_WRONLY | os.O_CREAT | os.O_EXCL
                                         | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600), "ab")
        hand_over(self.scratch, self.uid)
        return await super()._async_launch_kernel(kernel_cmd, **kw)


# JAX's compilation cache, in the kernel's scratch folder (compile_cache.py lends it a copy of the course's)
JAX_CACHE = ".jax_cache"

# Run by IPython in every kernel before its first cell (a startup file in the kernel's IPYTHONDIR)
STARTUP = f'''\
# Written by the autograder (autograder/sandbox.py), for grading.
def _set_up_for_grading():
    import os
    import sys

    # the modules the student handed in beside the notebook, importable by name as in their Jupyter; last
    # on the path, so that none of them stands in for an installed module
    sys.path.append(os.path.join(os.getcwd(), "{MODULES}"))

    # code compiled with torch.compile runs as the Python it was traced from: inductor would start a C++
    # compiler (Triton's on a GPU) for every kernel, seconds each, and a graded run's time would depend on
    # the compiler's cache. Where torch is not imported yet (a kernel not forked from the zygote),
    # from the first cell after it is: importing it here would cost every kernel its memory. Setting the
    # stance imports torch._dynamo (a second or more): where nothing has yet, the first torch.compile call
    # sets it, as that call would import it anyway
    def eager(*_):
        torch = sys.modules.get("torch")
        if torch is None or not hasattr(torch.compiler, "set_stance"):  # torch >= 2.6
            return
        if "torch._dynamo" in sys.modules:
            torch.compiler.set_stance("force_eager")
            if eager in shell.events.callbacks["pre_run_cell"]:
                shell.events.unregister("pre_run_cell", eager)
        elif not hasattr(torch.compile, "sets_eager_stance"):
            compile_ = torch.compile

            def compile_eagerly(*args, **kwargs):
                torch.compiler.set_stance("force_eager")
                return compile_(*args, **kwargs)

            compile_eagerly.sets_eager_stance = True
            torch.compile = compile_eagerly

    shell = get_ipython()  # IPython's, in a startup file
    shell.events.register("pre_run_cell", eager)
    eager()

    # exit() and quit() stopped the kernel 0.1 s after the cell's reply, while its output could still be on
    # its way: the grader then read garbled messages, or saw the kernel dead before the output's end, a
    # crash in that cell (which of the two, or neither, was a race). Here they only say so in the reply, as
    # before; the grader reads the cell to its end, stops grading there and shuts the kernel down
    def ask_exit():
        shell.payload_manager.write_payload(dict(source="ask_exit", keepkernel=shell.keepkernel_on_exit))

    shell.ask_exit = ask_exit


_set_up_for_grading()
del _set_up_for_grading
'''


def write_startup(scratch: Path) -> None:
    """``STARTUP`` where the kernel's IPython reads its startup files (``kernel_env``'s IPYTHONDIR)."""
    folder = scratch / ".ipython" / "profile_default" / "startup"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "00-grading.py").write_text(STARTUP)


def sandboxed(policy: SandboxPolicy) -> bool:
    """Whether kernels under ``policy`` run in bubblewrap (else only with its limits: a warning says so)."""
    return policy.use_bwrap and bwrap_problem() is None


def kernel_env(scratch: Path, policy: SandboxPolicy | None = None) -> dict:
    """A small environment: nothing of the grader's own variables leaks into the kernel."""
    env = {
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}/usr/bin:/bin",
        "HOME": str(scratch),
        "LANG": os.environ.get("LANG", "C.UTF-8"),
        "MPLBACKEND": "agg",
        "MPLCONFIGDIR": str(scratch / ".matplotlib"),
        "IPYTHONDIR": str(scratch / ".ipython"),
        "JUPYTER_PLATFORM_DIRS": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        "OMP_NUM_THREADS": "1",  # workers already run in parallel
        "JAX_COMPILATION_CACHE_DIR": str(scratch / JAX_CACHE),
        # every program, however quick to compile: a notebook compiles hundreds of small ones
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
        "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "-1",
        # not XLA's GPU autotuning cache: JAX would put its folder, which differs per kernel, into every key
        "JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES": "none",
        "NBGRADER_EXECUTION": "autograde",
        **_course_env(policy),
    }
    for name in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):  # the machine's BLAS workarounds
        if name in os.environ:
            env[name] = os.environ[name]
    return env


def _course_env(policy: SandboxPolicy | None) -> dict:
    """The course's variables; one naming where the sandbox shows the cases file names the file itself where
    there is no sandbox to show it."""
    if policy is None:
        return {}
    where = policy.cases_path if sandboxed(policy) or not policy.cases else policy.cases
    return {name: where if value == policy.cases_path else value for name, value in policy.env}
