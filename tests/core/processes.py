"""Python child processes for the process-level tests (group members, shared groups, auto-confirm): a script run
with ``python -c`` whose stdout lines are read with a deadline, killed with SIGKILL (after SIGCONT, so a stopped one
can die) when a test ends (the ``children`` fixture of tests/core/conftest.py)."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time


class Child:
    """A Python child process whose stdout lines are read with a deadline."""

    def __init__(self, script: str, *args: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", script, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def write_line(self, line: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()

    def has_line(self, timeout_s: float) -> bool:
        assert self.process.stdout is not None
        ready, _, _ = select.select([self.process.stdout], [], [], timeout_s)
        return bool(ready)

    def read_line(self, timeout_s: float = 60.0) -> str:
        assert self.process.stdout is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.process.stdout], [], [], 0.1)
            if ready:
                line = self.process.stdout.readline()
                if line:
                    return line
            if self.process.poll() is not None:
                break
        stderr = self.process.stderr.read() if self.process.poll() is not None and self.process.stderr else ""
        raise AssertionError(f"child printed nothing within {timeout_s:g} s (exit {self.process.poll()}): {stderr}")

    def kill(self) -> None:
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)

    def close(self) -> None:
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGCONT)  # a stopped process cannot die until it runs again
            self.kill()
        for pipe in (self.process.stdin, self.process.stdout, self.process.stderr):
            if pipe is not None:
                pipe.close()
