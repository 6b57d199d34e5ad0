"""The memory one student's server takes: JupyterLab, and a kernel that has run a notebook's imports.

    python benchmarks/user_server_memory.py

Starts JupyterLab on 127.0.0.1 in a scratch folder, starts a kernel through its REST API, runs the course's imports
in it (what notebook 07 and 09 import: torch and the course's checks) and prints each process's resident and
proportional set size (PSS: shared pages split between the processes that map them, what a node pays per pod).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import psutil

IMPORTS = "import numpy, torch, matplotlib.pyplot, alibi_ref.course"
TOKEN = "memory"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _api(url: str, method: str = "GET", body: dict | None = None) -> dict:
    request = urllib.request.Request(f"{url}?token={TOKEN}", method=method,
                                     data=None if body is None else json.dumps(body).encode())
    with urllib.request.urlopen(request, timeout=60) as reply:
        return json.loads(reply.read() or b"{}")


def _run_in_kernel(base: str, kernel_id: str, code: str) -> None:
    """The code run through the kernel's websocket-free route: jupyter_client, connected by the kernel's file."""
    from jupyter_client import BlockingKernelClient
    from jupyter_core.paths import jupyter_runtime_dir

    client = BlockingKernelClient(connection_file=os.path.join(jupyter_runtime_dir(), f"kernel-{kernel_id}.json"))
    client.load_connection_file()
    client.start_channels()
    reply = client.execute_interactive(code, timeout=300)
    client.stop_channels()
    if reply["content"]["status"] != "ok":
        raise RuntimeError(f"{code!r} failed in the kernel: {reply['content']}")


def _memory(process: psutil.Process) -> tuple[float, float]:
    info = process.memory_full_info()
    return info.rss / 2**20, info.pss / 2**20


def main() -> None:
    folder, port = tempfile.mkdtemp(prefix="alibi-memory-"), _port()
    server = subprocess.Popen([sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
                               f"--ServerApp.token={TOKEN}", f"--ServerApp.root_dir={folder}",
                               "--ServerApp.allow_root=True"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(120):
            try:
                _api(f"{base}/api/status")
                break
            except OSError:
                time.sleep(0.5)
        kernel = _api(f"{base}/api/kernels", "POST", {"name": "python3"})
        time.sleep(2)
        lab = psutil.Process(server.pid)
        print(f"JupyterLab server alone: RSS {_memory(lab)[0]:.0f} MiB")
        _run_in_kernel(base, kernel["id"], IMPORTS)
        kernels = lab.children(recursive=True)
        rows = [("JupyterLab server", *_memory(lab))] + [(f"kernel after `{IMPORTS}`", *_memory(k)) for k in kernels]
        for name, rss, pss in rows:
            print(f"{name:60} RSS {rss:6.0f} MiB   PSS {pss:6.0f} MiB")
        print(f"{'one student, server and kernel':60} RSS {sum(r[1] for r in rows):6.0f} MiB   "
              f"PSS {sum(r[2] for r in rows):6.0f} MiB")
    finally:
        server.terminate()
        server.wait(timeout=30)


if __name__ == "__main__":
    main()
