"""The job's session: heterps launch starts Paddle's launcher in a session of its own, and whatever is left in that
session when it ends (orphans of killed processes included) is stopped."""

from __future__ import annotations

import os
import signal
import time

import psutil

STOP_GRACE_S = 5.0


def _session_members(sid: int) -> list[int]:
    members = []
    for proc in psutil.process_iter(["pid", "status"]):
        try:
            # A zombie (the launcher child this process has not reaped yet, when a signal interrupted its
            # wait) has ended: counting it made every stop wait out the whole grace period.
            if proc.info["status"] == psutil.STATUS_ZOMBIE or proc.info["pid"] == os.getpid():
                continue
            if os.getsid(proc.info["pid"]) == sid:
                members.append(proc.info["pid"])
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return members


def stop_session(sid: int) -> list[str]:
    """SIGTERM every process of the job's session, then SIGKILL what is left; returns what they were."""
    members = _session_members(sid)
    described = []
    for pid in members:
        try:
            described.append(f"pid {pid} ({' '.join(psutil.Process(pid).cmdline())[:120]})")
        except psutil.Error:
            described.append(f"pid {pid}")
    for pid in members:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + STOP_GRACE_S
    while time.monotonic() < deadline and _session_members(sid):
        time.sleep(0.1)
    for pid in _session_members(sid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return described
