"""Run a fleet script under ``paddle.distributed.launch`` with the plan's process counts, and report
failure as failure.

    python -m heterps_paddle.tools.section_launch --plan PLAN.json --log_dir LOG [--timeout S] -- train.py ARGS

Why a wrapper: Paddle 2.6.2's PS launcher (``fleet/launch_utils.py``) waits only for the CPU trainers,
exits 0 whatever they returned, and leaves nothing behind only if it gets to its own clean-up.  This
wrapper starts it in its own process group, gives it a wall-clock bound, kills the whole group at the
end (no orphans, whatever happened), and exits non-zero when a process logged a heterps fatal error
(the watchdog's ``HETERPS-FATAL`` line, a plan/launch mismatch) or a Python traceback.
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import signal
import subprocess
import sys
import time

from heterps_paddle.runtime.dropin import TAKEOVER_END_TAG
from heterps_paddle.runtime.plan import launch_arguments, load_plan

def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.time() + 5
    while time.time() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def scan_logs(log_dir: str, heter_names: list[str] | None = None) -> list[str]:
    """What went wrong, per process log (workerlog.*, heterlog.*, serverlog.*); empty when nothing did.

    A process that the launcher stopped at the end of a good job logs Paddle's SIGTERM report; anything
    else that ends a log badly is an error: the watchdog's HETERPS-FATAL line, a Python traceback's
    exception line, a C++ exception (``what():``) or fatal signal, or a heterogeneous trainer whose log
    stops without the launcher having stopped it (it died: killed, crashed or exited).
    """
    found = []
    for path in sorted(glob.glob(os.path.join(log_dir, "*log.*"))):
        name = os.path.basename(path)
        try:
            with open(path, errors="replace") as f:
                lines = f.read().splitlines()
        except OSError:
            continue
        who = name
        m = re.fullmatch(r"heterlog\.(\d+)", name)
        if m and heter_names and int(m.group(1)) < len(heter_names):
            # The launcher numbers heterogeneous trainers in stage order.
            who = f"{name} ({heter_names[int(m.group(1))]})"
        for line in lines:
            m = re.search(r"heterps: process: (.*?); watching", line)
            if m:
                who = f"{name} ({m.group(1)})"
                break
        hit = None
        for i, line in enumerate(lines):
            if "HETERPS-FATAL" in line:
                hit = line.strip()
                break
            # A Python traceback (not Paddle's "C++ Traceback" printed when the launcher terminates a
            # process): report its exception line, the first unindented line after the header.
            if hit is None and line.startswith("Traceback (most recent call last)"):
                rest = [ln for ln in lines[i + 1:i + 400] if ln and not ln.startswith((" ", "\t"))]
                hit = (rest[0] if rest else line).strip()
            if hit is None and line.strip().startswith("what():"):
                hit = line.strip()
            if hit is None and "FatalError:" in line and "Termination signal" not in line:
                hit = line.strip()
        stopped_by_launcher = any("SIGTERM" in ln for ln in lines[-40:])
        # A heterogeneous trainer taken over behind an unchanged script (dropin.py) ends itself, exit 0,
        # once every previous-stage trainer has stopped: a clean end too.
        ended_by_takeover = any(TAKEOVER_END_TAG in ln for ln in lines[-40:])
        if hit is None and name.startswith("heterlog") and not (stopped_by_launcher or ended_by_takeover):
            hit = "heterogeneous trainer ended before the job did (died, was killed or exited)"
        if hit:
            found.append(f"{who}: {hit}")
    return found


def launch(plan_path: str | None, script_argv: list[str], log_dir: str, timeout: float,
           server_num: int = 1, launch_args: list[str] | None = None, env: dict | None = None) -> dict:
    """Run the job; returns {"returncode", "seconds", "errors", "timed_out"}; never leaves processes."""
    heter_names = []
    if plan_path is not None:
        plan = load_plan(plan_path)
        heter_names = [f"stage {st.index} heterogeneous trainer {i}" for st in plan.heter_stages()
                       for i in range(st.units)]
    if launch_args is None:
        if plan_path is None:
            raise ValueError("give plan_path or launch_args")
        launch_args = launch_arguments(plan, server_num, gpu_available=_gpu())
    os.makedirs(log_dir, exist_ok=True)
    cmd = [sys.executable, "-m", "paddle.distributed.launch", *launch_args, "--log_dir", log_dir, *script_argv]
    t0 = time.time()
    with open(os.path.join(log_dir, "launcher.out"), "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                env=env)
        timed_out = False
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            _kill_group(proc)
            proc.wait()
    errors = scan_logs(log_dir, heter_names)
    if timed_out:
        errors.append(f"job did not finish within {timeout:.0f} s; killed")
    return {"returncode": 1 if (errors or proc.returncode) else 0, "seconds": time.time() - t0,
            "errors": errors, "timed_out": timed_out}


def _gpu() -> bool:
    try:
        import paddle

        return bool(paddle.device.is_compiled_with_cuda()) and paddle.device.cuda.device_count() > 0
    except Exception:
        return False


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv:
        print("usage: python -m heterps_paddle.tools.section_launch --plan PLAN --log_dir DIR [--timeout S] "
              "[--server_num N] -- script.py ARGS", file=sys.stderr)
        return 2
    cut = argv.index("--")
    p = argparse.ArgumentParser(prog="heterps_paddle.tools.section_launch")
    p.add_argument("--plan", required=True)
    p.add_argument("--log_dir", required=True)
    p.add_argument("--timeout", type=float, default=3600)
    p.add_argument("--server_num", type=int, default=1)
    a = p.parse_args(argv[:cut])
    res = launch(a.plan, argv[cut + 1:], a.log_dir, a.timeout, a.server_num)
    for e in res["errors"]:
        print(f"heterps: {e}", file=sys.stderr)
    print(f"heterps: job {'FAILED' if res['returncode'] else 'finished'} in {res['seconds']:.1f} s "
          f"(logs in {a.log_dir})", file=sys.stderr)
    return res["returncode"]


if __name__ == "__main__":
    sys.exit(main())
