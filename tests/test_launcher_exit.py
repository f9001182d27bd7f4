"""A command that started services never leaves them running when it ends, however it ends:
SIGTERM unwinds it like Ctrl-C (the services are stopped on the way out) and a SIGKILLed
launcher's services get SIGTERM from the kernel. Real processes: `minedraft bench` on the
bundled pair, signalled while its services serve."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

STARTUP_S = 120.0
EXIT_S = 30.0


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
        except OSError:
            continue
        ppid = next((line.split()[1] for line in status.splitlines() if line.startswith("PPid:")), None)
        if ppid == str(pid):
            found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = next(line.split()[1] for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                     if line.startswith("State:"))
    except (OSError, StopIteration):
        return False
    return state != "Z"


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc; the kernel's parent-death signal is Linux's")
@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 130), (signal.SIGKILL, -signal.SIGKILL)])
def test_the_services_of_a_signalled_bench_stop_with_it(tmp_path, sig, code):
    bench = subprocess.Popen(
        [sys.executable, "-m", "minedraft.cli", "bench", "--modes", "sd", "--k", "2", "--concurrency", "1",
         "--num-prompts", "400", "--max-tokens", "64", "--warmup-s", "0", "--out", str(tmp_path)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + STARTUP_S
        services: list[int] = []
        while len(services) < 3 and time.monotonic() < deadline:     # verifier, gateway, drafter
            assert bench.poll() is None, bench.stderr.read()
            time.sleep(0.5)
            services = _children(bench.pid)
        assert len(services) == 3, f"services started: {services}"
        time.sleep(3.0)                                             # serving the bench's requests
        bench.send_signal(sig)
        assert bench.wait(EXIT_S) == code
        deadline = time.monotonic() + EXIT_S
        while any(_alive(pid) for pid in services) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [pid for pid in services if _alive(pid)], "services outlived the bench"
        if sig == signal.SIGTERM:
            assert "interrupted" in bench.stderr.read()
    finally:
        if bench.poll() is None:
            bench.kill()
        for pid in _children(bench.pid) + (services if "services" in locals() else []):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
