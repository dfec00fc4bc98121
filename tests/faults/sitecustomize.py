"""A fault for tests/test_host_restarts.py, injected into every Python process of a launched job by putting this
directory first on PYTHONPATH (Python imports ``sitecustomize`` at start-up): CPU trainer 0 holds one checkpoint
between the servers' save and its manifest, so that a host can be killed while that checkpoint is being written.

``HETERPS_TEST_HOLD_CHECKPOINT_PASS=N``: hold the checkpoint after pass N, once per job (``HETERPS_TEST_HOLD_MARKER``
is written with the checkpoint's temporary directory when the hold starts; a later round finds it and does not
hold), for ``HETERPS_TEST_HOLD_S`` seconds (default 300: longer than the test waits).  Unset: nothing is changed.
"""

import os
import time

_PASS = os.environ.get("HETERPS_TEST_HOLD_CHECKPOINT_PASS")

if _PASS:
    from heterps_paddle.runtime import launch_checkpoints

    _complete = launch_checkpoints.PassCheckpoints.complete

    def _held_complete(self, passes, staging, trainers):
        marker = os.environ["HETERPS_TEST_HOLD_MARKER"]
        if passes == int(_PASS) and not os.path.exists(marker):
            with open(marker + ".tmp", "w") as f:
                f.write(staging)
            os.replace(marker + ".tmp", marker)
            time.sleep(float(os.environ.get("HETERPS_TEST_HOLD_S", "300")))
        return _complete(self, passes, staging, trainers)

    launch_checkpoints.PassCheckpoints.complete = _held_complete
