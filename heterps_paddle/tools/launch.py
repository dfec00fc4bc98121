"""``heterps launch``: ``python -m paddle.distributed.launch`` for parameter-server jobs, with failures that fail.

    heterps launch --server_num=1 --worker_num=2 [--heter_worker_num=1 --heter_devices=cpu] --log_dir log \\
        train.py ARGS                     # the same arguments as paddle.distributed.launch
    heterps launch --hosts HOSTS --plan PLAN [--host ADDR] [--restarts N] --log_dir log train.py ARGS
                                          # across hosts: the same command on every host
    heterps launch --leave --log_dir log  # that host leaves the running job (as SIGTERM to its launch does)

This module only reads the command line (launch/options.py) and hands it to the launch (launch/driver.py), which
owns a job's life: supervision (a process that dies fails the job, naming it; nothing is left running), the
rounds across hosts, retries and restarts (launch/machine.py), and the progress echoed to the console.
"""

from __future__ import annotations

import sys

from heterps_paddle.launch import driver
from heterps_paddle.launch.leave import is_leave, leave_command
from heterps_paddle.launch.options import USAGE, OptionsError, parse


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["-h"], ["--help"]):
        print(USAGE)
        return 0
    if is_leave(argv):
        return leave_command(argv)
    try:
        options = parse(argv)
    except OptionsError as exc:
        print(exc, file=sys.stderr, flush=True)
        return OptionsError.exit_code
    return driver.run(options)


if __name__ == "__main__":
    sys.exit(main())
