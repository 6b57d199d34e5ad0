"""The kernel zygote, run inside a student's sandbox as ``python -c <this file> NAME,... [MODULE ...]``.

NAME,...: the environment variables a spawn request may set in a kernel (its own folders, the grading mode).

It imports the kernel (ipykernel, IPython) and the heavy modules the course's notebooks use once,
says ``{"ready": true}``, then serves the grader's requests on its standard input and output, one
JSON line each way (no socket: nothing in the sandbox but the grader can ask it anything):

    {"op": "spawn", "connection_file": F, "cwd": D, "log": L, "env": {...}} -> {"pid": P}
    {"op": "poll", "pid": P}                                              -> {"exit": None | code}
    {"op": "signal", "pid": P, "signal": S}                               -> {"ok": True}

A spawned kernel is a fork: a fresh process whose memory starts as the zygote's right after the
imports, as if it had imported them itself, in its own session (so a signal to it and its process
group never reaches the zygote), holding neither end of the grader's pipes. Forking is safe here
because the zygote has one thread (the sandbox sets OMP_NUM_THREADS=1, and none of the preloaded
modules starts a thread on import).
This file imports nothing of the autograder: the sandbox does not show it the grader's code.
"""

import ctypes
import importlib
import json
import os
import sys

PR_SET_DUMPABLE = 4


def _dumpable(flag: int) -> None:
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, flag, 0, 0, 0)


def _serve(settable: set[str], preload: list[str]) -> None:
    # the grader's pipes, kept away from what the imports and the kernels print: fds 0 and 1 become /dev/null and
    # the log, and every fork closes these two
    requests, replies = os.fdopen(os.dup(0), "r"), os.fdopen(os.dup(1), "w")
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    os.dup2(2, 1)
    _dumpable(0)  # a kernel (the same user) can neither trace the zygote nor open its descriptors under /proc
    import ipykernel.kernelapp  # noqa: F401  (the kernel itself: what every notebook needs)

    for name in preload:
        try:
            importlib.import_module(name)
        except Exception as err:  # a module the course lacks: its notebooks import it themselves, or fail there
            print(f"zygote: could not preload {name}: {type(err).__name__}: {err}", file=sys.stderr, flush=True)
    exits: dict[int, int] = {}
    replies.write(json.dumps({"ready": True}) + "\n")
    replies.flush()
    for line in requests:
        request = json.loads(line)
        if request["op"] == "spawn":
            pid = os.fork()
            if pid == 0:
                requests.close()
                replies.close()
                _become_kernel(request, settable)
            reply = {"pid": pid}
        elif request["op"] == "poll":
            reply = {"exit": _poll(request["pid"], exits)}
        elif request["op"] == "signal":
            try:
                os.killpg(request["pid"], request["signal"])
            except ProcessLookupError:
                pass
            reply = {"ok": True}
        else:
            reply = {"error": f"unknown op {request['op']!r}"}
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


def _poll(pid: int, exits: dict[int, int]):
    if pid in exits:
        return exits[pid]
    try:
        done, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return exits.setdefault(pid, -1)
    if done == 0:
        return None
    exits[pid] = os.waitstatus_to_exitcode(status)
    return exits[pid]


def _become_kernel(request: dict, settable: set[str]) -> None:
    try:
        os.setsid()
        _dumpable(1)  # the kernel's own /proc entries are its own again (the zygote's stay closed)
        os.chdir(request["cwd"])
        env = request.pop("env", {})
        os.environ.update({name: value for name, value in env.items() if name in settable})
        # as a kernel started on its own: its chatter on stdout dropped, stderr kept for when it dies
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
        os.dup2(log, 2)
        from ipykernel import kernelapp

        # parent_handle=0: the kernel's parent is the zygote, which ipykernel would otherwise watch
        sys.argv = [sys.executable, "-f", request["connection_file"], "--IPKernelApp.parent_handle=0"]
        kernelapp.launch_new_instance()
    finally:
        os._exit(0)


if __name__ == "__main__":
    _serve(set(sys.argv[1].split(",")), sys.argv[2:])
