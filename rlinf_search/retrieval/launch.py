"""Start the retrieval server as a child process and wait until it answers (tests, demo, benchmarks).

From a shell script that started the server itself with ``--port 0 --save-address-to FILE``:

    ADDR=$(python -m rlinf_search.retrieval.launch --wait-for FILE --timeout 120)
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx


class ServerStartError(RuntimeError):
    """The server process exited or did not become healthy in time."""


def is_healthy(address: str) -> bool:
    """Whether the server at ``host:port`` answers ``/health`` with 200."""
    try:
        return httpx.get(f"http://{address}/health", timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


def wait_for_address_file(path: Path, timeout_s: float) -> str:
    """The address a server wrote to ``path`` (``--save-address-to``), once it answers ``/health``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.is_file():
            address = path.read_text().strip()
            if address and is_healthy(address):
                return address
        time.sleep(0.2)
    raise ServerStartError(f"no healthy retrieval server wrote its address to {path} within {timeout_s:.0f} s; "
                           f"see the server's log")


class RetrievalServerProcess:
    """``with RetrievalServerProcess([...server args...]) as server: server.url``"""

    def __init__(self, server_args: list[str], *, startup_timeout_s: float = 180.0,
                 log_path: str | os.PathLike | None = None, env: dict | None = None):
        self.server_args = list(server_args)
        self.startup_timeout_s = startup_timeout_s
        self._workdir = tempfile.TemporaryDirectory(prefix="rlinf-retrieval-")
        self.address_file = Path(self._workdir.name) / "address"
        self.log_path = Path(log_path) if log_path else Path(self._workdir.name) / "server.log"
        self.env = env
        self.process: subprocess.Popen | None = None
        self.address = ""

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    def start(self) -> "RetrievalServerProcess":
        self.address_file.unlink(missing_ok=True)
        command = [sys.executable, "-m", "rlinf_search.retrieval.server", "--port", "0",
                   "--save-address-to", str(self.address_file), *self.server_args]
        self._log = open(self.log_path, "ab")
        self.process = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT,
                                        env=self.env, start_new_session=True)
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ServerStartError(f"retrieval server exited with {self.process.returncode}: "
                                       f"{self.log_tail()}")
            if self.address_file.is_file():
                self.address = self.address_file.read_text().strip()
                if self._healthy():
                    return self
            time.sleep(0.1)
        self.stop()
        raise ServerStartError(f"retrieval server not healthy after {self.startup_timeout_s:.0f} s: {self.log_tail()}")

    def _healthy(self) -> bool:
        return is_healthy(self.address)

    def log_tail(self, lines: int = 5) -> str:
        if not self.log_path.is_file():
            return "(no log)"
        return " | ".join(self.log_path.read_text(errors="replace").strip().splitlines()[-lines:])

    def kill(self) -> None:
        """Kill at once (SIGKILL), as a crash would."""
        if self.process and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()
        if getattr(self, "_log", None):
            self._log.close()

    def __enter__(self) -> "RetrievalServerProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
        self._workdir.cleanup()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlinf_search.retrieval.launch",
                                     description="Wait for a server started with --save-address-to; print its address.")
    parser.add_argument("--wait-for", required=True, type=Path, help="the file given to --save-address-to")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds to wait")
    args = parser.parse_args(argv)
    try:
        print(wait_for_address_file(args.wait_for, args.timeout))
    except ServerStartError as exc:
        print(f"launch: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
