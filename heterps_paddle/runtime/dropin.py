"""What the extension does so that an unchanged fleet script (PaddleRec's static PS trainer style: build the
net, ``minimize``, ``init_worker``, ``train_from_dataset`` per epoch, held-out evaluation with a forward-only
copy, ``stop_worker``) runs a split plan.  Installed by ``runtime.prepare_sections`` (the meta optimizer, plans
with more than one stage); the explicit alternative is a section-aware script (ctr_job.py).

- Heterogeneous trainers are taken over in ``init_worker`` (:func:`_init_worker`): they serve the pipeline in
  one ``train_from_dataset`` until every CPU trainer has called ``stop_worker``, then end the process (exit 0),
  so the script's data reading, epochs and evaluation never run there.
- CPU trainers' ``train_from_dataset`` of the section drops fetch vars that live in a later stage's section
  (loss, AUC: the last stage prints them), and :func:`train_auc_is_elsewhere` tells evaluation.py that this
  process computes no train AUC.
- ``forward_only_program`` of a section gives a copy of the whole model's forward pass, stashed before the
  split (:func:`stash_forward`); when it runs, its lookups read the servers' tables and every dense table is
  pulled from the servers first (:func:`run_heldout`), so the held-out AUC is the servers' model.

Imports Paddle only inside functions (evaluation.py asks :func:`train_auc_is_elsewhere` without Paddle).
"""

from __future__ import annotations

import os
import sys

# Per process.  forward/startup: the whole model's forward pass and startup, cloned before the split;
# loss: the loss var's name; live: AUC state names that an evaluation pass has filled on this process.
# explicit: the script is section-aware (ctr_job.py: runtime.section_aware()) and drives every stage itself.
_state: dict = {"forward": None, "startup": None, "loss": None, "live": set(), "dropped_logged": False,
                "auc_logged": False, "explicit": False}

TAKEOVER_TAG = "heterps: heterogeneous trainer taken over"
TAKEOVER_END_TAG = "heterps: heterogeneous trainer done"


def stash_forward(program, startup, loss) -> None:
    """Called before the program is tagged and split (forward ops only at that point)."""
    _state["forward"] = program.clone(for_test=True)
    _state["startup"] = startup.clone()
    _state["loss"] = getattr(loss, "name", None)
    # Marks the clone so forward_only_program (and our train_from_dataset) can tell it from a section.
    _state["forward"]._heterps_whole_forward = True


def sectioned() -> bool:
    """True in a process of a job whose program this process split into sections."""
    return _state["forward"] is not None


def set_section_aware() -> None:
    _state["explicit"] = True


def takes_over() -> bool:
    """Whether the drop-in behaviour applies: a split job run by a script that is not section-aware."""
    return sectioned() and not _state["explicit"]


def _role() -> str:
    from heterps_paddle.runtime.sections import role

    return role()


def whole_forward_program():
    """A fresh forward-only copy of the whole (pre-split) model, for held-out evaluation."""
    prog = _state["forward"].clone(for_test=True)
    prog._heterps_whole_forward = True
    return prog


def is_whole_forward(program) -> bool:
    return bool(getattr(program, "_heterps_whole_forward", False))


def train_auc_is_elsewhere(scope, auc_states) -> bool:
    """On a CPU trainer of a sectioned job the AUC ops run in the last stage's section: the state vars in
    its global scope hold nothing (or do not exist) until an evaluation pass of the whole forward program
    filled them.  (A scope of the script's own, e.g. ctr_job's evaluation scope, is the script's business.)"""
    if not takes_over() or _role() != "trainer":
        return False
    import paddle

    if scope is not paddle.static.global_scope():
        return False
    if all(s.name in _state["live"] for s in auc_states):
        return False
    if not _state["auc_logged"]:
        _state["auc_logged"] = True
        print("heterps: train AUC is not computed on a stage 1 CPU trainer of a split plan (the AUC ops are in "
              "the last stage's section): printed here as nan; the last stage's heterogeneous trainer prints "
              "the train loss and AUC in its log (heterlog.*)", flush=True)
    return True


def section_fetch(program, fetch_list, fetch_info):
    """The fetch vars this section has (in any of its blocks); the others are dropped, with a log line once."""
    if not fetch_list:
        return fetch_list, fetch_info
    names = {n for blk in program.blocks for n in blk.vars}
    keep, info, dropped = [], [], []
    for i, var in enumerate(fetch_list):
        name = var if isinstance(var, str) else var.name
        if name in names:
            keep.append(var)
            if fetch_info:
                info.append(fetch_info[i])
        else:
            dropped.append(name)
    if dropped and not _state["dropped_logged"]:
        _state["dropped_logged"] = True
        print(f"heterps: fetch vars {dropped} are computed by a later stage of the split plan, not by this "
              f"section; not fetched here (the last stage's heterogeneous trainer prints the loss and AUC)",
              flush=True)
    return (keep or None), (info or None)


def _materialise(exe, program, scope) -> list[str]:
    """Create, in ``scope``, the persistable vars of ``program`` that this process's section never made (the
    later stages' parameters, the AUC states), initialised by the whole model's startup program."""
    import paddle

    from paddle.base import core

    missing = []
    for blk in program.blocks:
        for name, var in blk.vars.items():
            # Dense tensors only: the sparse table (SELECTED_ROWS) stays on the servers, the lookups read it.
            if not var.persistable or var.type != core.VarDesc.VarType.LOD_TENSOR:
                continue
            found = scope.find_var(name)
            if found is None:
                missing.append(name)
                continue
            try:
                if not found.get_tensor()._is_initialized():
                    missing.append(name)
            except ValueError:  # the scope holds another kind of variable under this name: leave it
                pass
    if not missing:
        return []
    tmp = paddle.static.Scope()
    startup = _state["startup"].clone()
    # Initialise only what is missing: the full startup also initialises the sparse table's local copy.
    block = startup.global_block()
    for idx in reversed(range(len(block.ops))):
        if not set(block.ops[idx].output_arg_names) & set(missing):
            block._remove_op(idx, sync=False)
    startup._sync_with_cpp()
    with paddle.static.scope_guard(tmp):
        exe.run(startup)
    made = []
    for name in missing:
        src = tmp.find_var(name)
        if src is None or not src.get_tensor()._is_initialized():
            continue  # e.g. a var no startup op writes; the forward pass writes it first
        scope.var(name).get_tensor().set(src.get_tensor(), paddle.CPUPlace())
        made.append(name)
    return made


def run_heldout(exe, original, program, dataset, scope, args, kwargs):
    """Run the whole model's forward pass with the servers' parameters (CPU trainer, after training)."""
    import paddle
    from paddle.distributed import fleet

    from heterps_paddle.runtime.sections import distributed_eval_program, pull_dense_into

    rt = fleet.fleet._runtime_handle
    prog = getattr(program, "_heterps_eval", None)
    if prog is None:
        # Deferred to here: the lookups' table ids come from the runtime's send context (init_worker).
        prog = distributed_eval_program(program, rt)
        program._heterps_eval = prog
    scope = scope if scope is not None else paddle.static.global_scope()
    made = _materialise(exe, prog, scope)
    pulled = pull_dense_into(scope, rt)
    for op in (op for blk in prog.blocks for op in blk.ops if op.type == "auc"):
        _state["live"].update(op.output("StatPosOut") + op.output("StatNegOut"))
    print(f"heterps: held-out evaluation of the whole model (forward program from before the split): "
          f"{len(made)} vars created here, {len(pulled)} dense vars pulled from the servers, sparse rows read "
          f"from the servers' tables", flush=True)
    return original(exe, prog, dataset, scope, *args, **kwargs)


# ------------------------------------------------------------------------------------------------------
# Heterogeneous trainer takeover.
#
# Hook: the PS runtime's ``_init_worker`` (TheOnePSRuntime), not ``Fleet.init_worker``: the script calls
# ``fleet.init_worker()`` through paddle.distributed.fleet's module attribute, which is a method bound when
# Paddle was imported (``init_worker = fleet.init_worker``), so patching the Fleet class would miss it;
# every path ends in the runtime's ``_init_worker``.  It is also the first point where the section and
# the startup have run (scripts run the startup before init_worker) and where nothing of the script's own
# training has started: from here the heter trainer's whole job is to serve the pipeline.
# ------------------------------------------------------------------------------------------------------


def _heter_loss_and_auc(program):
    names = []
    if _state["loss"]:
        names.append((_state["loss"], "loss"))
    # The first auc op is the accumulated AUC (models may add a per-batch one after it).
    auc_ops = [op for blk in program.blocks for op in blk.ops if op.type == "auc"]
    if auc_ops:
        names.append((auc_ops[0].output("AUC")[0], "auc"))
    fetch, info = [], []
    for name, label in names:
        for blk in program.blocks:
            if name in blk.vars:
                fetch.append(blk.vars[name])
                info.append(label)
                break
    return fetch, info


def serve_and_exit(runtime_handle) -> None:
    """The rest of a heterogeneous trainer's life after init_worker: serve, stop, exit 0."""
    import threading
    import time

    import paddle

    from heterps_paddle.runtime.sections import heter_worker_dataset, stage_id

    program = paddle.static.default_main_program()  # the section (fix 3 switched the default)
    fetch, info = _heter_loss_and_auc(program)
    period = int(os.environ.get("HETERPS_HETER_PRINT_PERIOD", "20"))
    print(f"{TAKEOVER_TAG} (stage {stage_id()}): serving the pipeline in one train_from_dataset until every "
          f"CPU trainer calls stop_worker; the script's own code after init_worker does not run here "
          f"(prints {info} every {period} batches)", flush=True)
    # In Paddle 2.6.2 a heter trainer's train_from_dataset does not return: after the heter server stops
    # (a stop from each of its fan_in previous-stage trainers, HeterClient::Stop in their stop_worker) its
    # section workers still block in their task queue's Pop().  So the end is seen from outside: the
    # listen port closes when the server stops, and a thread ends the process then.
    ender = threading.Thread(target=_end_when_served, args=(runtime_handle, time.time()),
                             name="heterps-takeover-end",
                             daemon=True)
    ender.start()
    exe = paddle.static.Executor(paddle.CPUPlace())  # the section's heter_place decides where it runs
    exe.train_from_dataset(program, heter_worker_dataset(program), fetch_list=fetch or None,
                           fetch_info=info or None, print_period=period, debug=False)
    ender.join()  # (if Paddle returns after all, the ender still does the ending)


def _end_when_served(runtime_handle, t0: float, poll_s: float = 0.2) -> None:
    import time

    from paddle.distributed import fleet

    from heterps_paddle.runtime.sections import _reachable, _refresh, _watchdog, stage_id

    me = f"{os.environ.get('POD_IP', '127.0.0.1')}:{os.environ.get('PADDLE_PORT', '0')}"
    seen_up = False
    while True:
        up = _reachable(me, timeout=0.5)
        seen_up = seen_up or up
        if seen_up and not up:
            break
        time.sleep(poll_s)
    served = time.time() - t0
    dog = _watchdog.get("dog")
    if dog is not None:
        dog.armed = False  # the job is ending: servers and CPU trainers go away now, not by failure
    refresher = _refresh.get("current")
    if refresher is not None:
        refresher.stop()  # no dense pull racing with the client's shutdown
    print(f"{TAKEOVER_END_TAG}: served {served:.1f} s, until every previous-stage trainer sent its stop "
          f"(heter server {me} closed); stopping", flush=True)
    if stage_id() < int(os.environ.get("STAGE_NUM", "2")):
        fleet.stop_worker()  # a middle stage's stop is what its next stage waits for (its fan_in)
    else:
        # The last stage has no next stage: HeterClient::Stop would send its stop to zero channels and
        # wait forever for the answers (Paddle 2.6.2's SendCmd completes after the last of 0 replies).
        runtime_handle._worker.stop_worker()
    print(f"{TAKEOVER_END_TAG}: stop_worker done; exit 0", flush=True)
    sys.stdout.flush()
    sys.stderr.flush()
    # os._exit: the main thread is blocked in C++ for good, and the script must not go on (it would read
    # data and train); a normal interpreter exit can also crash in the brpc client's exit path.
    os._exit(0)


def install() -> None:
    """Wrap the PS runtime's _init_worker once per process (only heterogeneous trainers are affected)."""
    from paddle.distributed.ps import the_one_ps

    cls = the_one_ps.TheOnePSRuntime
    if getattr(cls._init_worker, "_heterps_wrapped", False):
        return
    original = cls._init_worker

    def _init_worker(self, scopes=None):
        if not takes_over() or _role() != "heter":
            return original(self, scopes)
        # A heterogeneous trainer is in no gloo world (the launcher's gloo "worker" world is the CPU
        # trainers; Paddle makes no communicator for heter trainers), but with PADDLE_WITH_GLOO=1 gloo reads
        # as initialised and _init_worker's fleet.util.barrier() fails on the missing worker comm.  Without
        # gloo those barriers are no-ops and all_gather returns its input: what a heter trainer needs.
        gloo = getattr(self.role_maker, "_gloo", None)
        if gloo is not None and getattr(gloo, "_worker_comm", None) is None:
            gloo._is_initialized = False
        original(self, scopes)
        serve_and_exit(self)

    _init_worker._heterps_wrapped = True
    cls._init_worker = _init_worker

    original_stop = cls._stop_worker

    def _stop_worker(self):
        original_stop(self)
        if takes_over() and _role() == "trainer":
            wait_for_heter_trainers()

    cls._stop_worker = _stop_worker


def wait_for_heter_trainers(timeout: float | None = None) -> bool:
    """After a CPU trainer's stop_worker: wait (bounded) until every heterogeneous trainer's endpoint has
    closed, i.e. they have seen every CPU trainer's stop and finished serving.

    Why: Paddle's launcher ends the job (SIGTERM to heter trainers and servers) as soon as the CPU
    trainers exit, while a heter trainer notices the last stop only on its listen loop's next poll (1 s),
    then stops its own next stage and ends; killed in between, its log ends without the takeover's last
    line and later stages get no stop."""
    import time

    from heterps_paddle.runtime.sections import _reachable, _split_eps

    eps = _split_eps(os.environ.get("PADDLE_ALL_HETER_TRAINER_IP_PORT_LIST"))
    timeout = float(os.environ.get("HETERPS_STOP_WAIT_S", "60")) if timeout is None else timeout
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        open_eps = [ep for ep in eps if _reachable(ep, timeout=0.5)]
        if not open_eps:
            # The port closes when the heter server stops; the process then stops its own client and
            # exits, which takes a moment more.
            time.sleep(float(os.environ.get("HETERPS_STOP_GRACE_S", "1.5")))
            return True
        time.sleep(0.2)
    print(f"heterps: heterogeneous trainers {open_eps} still serving {timeout:.0f} s after this trainer's "
          f"stop_worker (another CPU trainer has not stopped?); not waiting longer", flush=True)
    return False
