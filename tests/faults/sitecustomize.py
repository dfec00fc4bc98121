"""Faults for the launched tests, injected into every Python process of a launched job by putting this
directory first on PYTHONPATH (Python imports ``sitecustomize`` at start-up), at the runtime's named hook points
(heterps_paddle/runtime/hooks.py), never by patching its methods: CPU trainer 0 holds one checkpoint
between the servers' save and its manifest (at the start of its background phase, ``persist``: training goes on), so
that a host or the persisting process can be killed while that checkpoint is being written.

``HETERPS_TEST_HOLD_CHECKPOINT_PASS=N``: hold the checkpoint after pass N, once per job (``HETERPS_TEST_HOLD_MARKER``
is written with the holding process's pid and the checkpoint's staging directory when the hold starts; a later round finds it and does not
hold), for ``HETERPS_TEST_HOLD_S`` seconds (default 300: longer than the test waits).

``HETERPS_TEST_CONNECT_ABORT=ROLE`` (a ``TRAINING_ROLE``, e.g. ``HETER_TRAINER``): the first process of that role in
a job (``HETERPS_TEST_CONNECT_ABORT_MARKER`` is written when it fires; later attempts find it) ends as Paddle's
HeterClient ends a process whose brpc connect took longer than 200 ms (tools/paddle_aborts.py; docs/paddle-notes.md):
its message on stderr, then SIGABRT.  It fires once this process's own endpoint listens (its pipeline serves, so the
first backward message is due), or after 60 s.  Nothing on a busy machine makes Paddle's own abort come on cue.

``HETERPS_TEST_TRAINED_DIR=DIR``: every stage 1 CPU trainer appends, once each ``train_from_dataset`` Paddle ran
for it has returned (a call of a pass pulled shard by shard, runtime/pulled_pass.py), a JSON line to
``DIR/trained-<pid>.jsonl``:
the pass, the files that run trained, the host and the launch id (one a round), so a test counts what each trainer
trained across rounds.  With
``HETERPS_TEST_WAIT_PASS=N`` and ``HETERPS_TEST_WAIT_FOR=PATH``, the trainers wait before their second call of pass N
until PATH exists (300 s at most; each writes ``DIR/waiting-<pid>`` as it starts waiting, holding the shards of that
call): a test then asks for something (a leave) while they are to run.

``HETERPS_TEST_CHANGE_RESTORED=PARAM``: every parameter server, once its ``init_server`` restored the launch's
checkpoint (its files verified and loaded), loads dense parameter PARAM's table again with its first element's value
changed (+0.5): the servers then hold something other than what the checkpoint captured, and only a check of what
they hold can tell (runtime/restore_check.py).

Unset: nothing is changed.
"""

import os
import socket
import sys
import threading
import time

_PASS = os.environ.get("HETERPS_TEST_HOLD_CHECKPOINT_PASS")

if _PASS:
    from heterps_paddle.runtime import hooks as _hooks

    def _hold(captured):
        marker = os.environ["HETERPS_TEST_HOLD_MARKER"]
        if captured.at.passes == int(_PASS) and not captured.at.slice and not os.path.exists(marker):
            with open(marker + ".tmp", "w") as f:
                f.write(f"{os.getpid()} {captured.staging}")
            os.replace(marker + ".tmp", marker)
            time.sleep(float(os.environ.get("HETERPS_TEST_HOLD_S", "300")))

    _hooks.add("before_persist", _hold)


_ABORT_ROLE = os.environ.get("HETERPS_TEST_CONNECT_ABORT")


def _listens(address, port):
    try:
        with socket.create_connection((address, int(port)), timeout=0.5):
            return True
    except OSError:
        return False


def _connect_timeout_abort(marker):
    address, port = os.environ.get("POD_IP", "127.0.0.1"), os.environ.get("PADDLE_PORT", "0")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not _listens(address, port):
        time.sleep(0.2)
    time.sleep(0.5)
    peer = (os.environ.get("PADDLE_PREVIOUS_HETER_TRAINER_IP_PORT_LIST") or "127.0.0.1:1").split(",")[0]
    with open(marker, "w") as f:
        f.write(f"{os.getpid()}\n")
    sys.stderr.write(
        "terminate called after throwing an instance of 'phi::enforce::EnforceNotMet'\n"
        "  what():  (Unimplemented) HeterClient::SendAndRecv meets brpc error, error message is [E110]Fail to "
        f"connect Socket{{id=7 addr={peer}}} (0x0): Connection timed out [R1][E112]Not connected to {peer} yet\n"
    )
    sys.stderr.flush()
    os.abort()


if _ABORT_ROLE and os.environ.get("TRAINING_ROLE") == _ABORT_ROLE:
    _marker = os.environ["HETERPS_TEST_CONNECT_ABORT_MARKER"]
    if not os.path.exists(_marker):
        threading.Thread(target=_connect_timeout_abort, args=(_marker,), daemon=True).start()


_TRAINED = os.environ.get("HETERPS_TEST_TRAINED_DIR")

if _TRAINED:
    import json

    from heterps_paddle.runtime import hooks as _hooks

    _runs_of_pass = {}  # pass number -> the train_from_dataset runs of it this process ran

    def _recorded(number, call, run):
        runs = _runs_of_pass.setdefault(number, [])
        wait_for = os.environ.get("HETERPS_TEST_WAIT_FOR")
        if len(runs) == 1 and str(number) == os.environ.get("HETERPS_TEST_WAIT_PASS") and wait_for:
            open(os.path.join(_TRAINED, f"waiting-{os.getpid()}"), "w").close()  # past the first call
            deadline = time.monotonic() + 300
            while not os.path.exists(wait_for) and time.monotonic() < deadline:
                time.sleep(0.1)
        files = list(call.dataset.filelist)
        result = run(call)
        runs.append(files)
        with open(os.path.join(_TRAINED, f"trained-{os.getpid()}.jsonl"), "a") as f:
            record = {"pass": number, "files": files, "host": os.environ.get("POD_IP")}
            f.write(json.dumps({**record, "launch": os.environ.get("HETERPS_LAUNCH_ID")}) + "\n")
        return result

    _hooks.add("around_train_run", _recorded)


_CHANGE = os.environ.get("HETERPS_TEST_CHANGE_RESTORED")


def _change_restored(runtime, parameter):
    import tempfile

    from heterps_paddle.runtime import checkpoint, launch_checkpoints, seam

    choice = launch_checkpoints.resume_choice()
    if choice is None or choice.path is None:
        return
    manifest = checkpoint.read_manifest(choice.path)
    source = tuple(checkpoint.DenseTable.from_dict(t) for t in manifest["dense_tables"])
    target = checkpoint.dense_layout(runtime, bool(runtime.is_heter_ps_mode))
    tables = checkpoint.regroup(choice.path, source, target)
    for table in target:
        if parameter not in table.names:
            continue
        first = sum(table.numels[: table.names.index(parameter)])
        columns = tables[table.table_id][first].split(b" ")
        columns[0] = f"{float(columns[0]) + 0.5:g}".encode()
        tables[table.table_id][first] = b" ".join(columns)
        changed = tempfile.mkdtemp(prefix="heterps-test-changed-")
        checkpoint._write_tables(changed, {table.table_id: tables[table.table_id]})
        seam.server_service(runtime).load_sparse(changed, "0", table.table_id)
        print(f"heterps test: {parameter}'s first value changed on the servers after the restore", flush=True)


if _CHANGE:
    from heterps_paddle.runtime import hooks as _hooks

    _hooks.add("after_restore", lambda runtime: _change_restored(runtime, _CHANGE))
