"""``torchburn serve`` started as a real process on a free loopback port, for the server tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

STARTUP_S = 120.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServerProcess:
    """``torchburn serve ARGS`` on a free port of 127.0.0.1, its output in ``log``."""

    def __init__(self, args: list[str], log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONUNBUFFERED": "1"}
        env.pop("TORCHBURN_API_KEY", None)
        command = [
            sys.executable,
            "-c",
            "from torchburn_cli.app import main; main()",
            "serve",
            "--port",
            str(self.port),
        ]
        with log.open("wb") as out:
            self.process = subprocess.Popen([*command, *args], stdout=out, stderr=subprocess.STDOUT, env=env)
        self._wait_ready()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + STARTUP_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited with {self.process.returncode}:\n{self.output()}")
            try:
                # any answer (a 401 where a key is required) means it listens
                httpx.get(self.url + "/health", timeout=2.0)
                return
            except httpx.TransportError:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"the server did not start within {STARTUP_S:.0f} s:\n{self.output()}")

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def interrupt(self, timeout: float = 30.0) -> int:
        """Ctrl-C, as a terminal sends it; the exit status."""
        self.process.send_signal(signal.SIGINT)
        return self.process.wait(timeout)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
