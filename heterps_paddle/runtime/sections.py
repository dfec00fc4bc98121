"""What a fleet script needs around a sectioned job: preparing minimize, the heter workers' dataset,
held-out evaluation from the servers' parameters.

Imports Paddle (only used inside launched processes).
"""

from __future__ import annotations

import os

import paddle

from heterps_paddle.program.partition import tag_program
from heterps_paddle.runtime.plan import SectionPlan

# Communicator settings under which routing dense grads through Communicator::Send (fix 5) ran near the
# speed of plain async PS (notes/paddle-2.6.2.md); defaults made it ~7x slower. Only defaults: a user's
# own FLAGS_* environment wins.
COMMUNICATOR_ENV_DEFAULTS = {
    "FLAGS_communicator_send_queue_size": "16",
    "FLAGS_communicator_max_merge_var_num": "16",
    "FLAGS_communicator_send_wait_times": "1",
    "FLAGS_communicator_thread_pool_size": "8",
}


def prepare_sections(program, plan: SectionPlan, strategy, startup_program=None, loss=None) -> dict[str, int]:
    """Called from HeterPSOptimizer.minimize_impl before backward: tag ops, install the fixed builder and
    what an unchanged fleet script needs (dropin.py)."""
    from heterps_paddle.runtime import dropin, paddle_fixes

    # Before tagging and splitting: held-out evaluation needs the whole model's forward pass.
    dropin.stash_forward(program, startup_program or paddle.static.default_startup_program(), loss)
    dropin.install()
    layer_stage = tag_program(program, plan)
    paddle_fixes.install()
    paddle_fixes.FixedHeterProgramBuilder.expected_stages = plan.num_stages
    for k, v in COMMUNICATOR_ENV_DEFAULTS.items():
        os.environ.setdefault(k, v)  # read by TrainerRuntimeConfig inside the PS optimizer's minimize
    start_watchdog()
    _wrap_train_from_dataset()
    return layer_stage


def section_aware() -> None:
    """Called by a section-aware script (ctr_job.py) before ``fleet.init_worker()``: it runs every stage's
    ``train_from_dataset`` itself, so heterogeneous trainers are not taken over (dropin.py) and CPU trainers'
    ``stop_worker`` does not wait for them."""
    from heterps_paddle.runtime import dropin

    dropin.set_section_aware()


def dense_refresh_mode() -> str:
    """How a section's dense parameters come back from the servers (fix 5; docs/sections.md):

    ``pull`` (default): grads are pushed as Paddle generates them (every micro-batch) and a thread pulls
    the section's dense tables every HETERPS_DENSE_PULL_MS (20) ms, like plain async PS's pull-dense
    worker.  ``communicator``: dense sends go through Communicator::Send and its recv thread.
    """
    mode = os.environ.get("HETERPS_DENSE_REFRESH", "pull")
    if mode not in ("pull", "communicator"):
        from heterps_paddle.runtime.plan import PlanError

        raise PlanError(f"HETERPS_DENSE_REFRESH must be 'pull' or 'communicator', got {mode!r}")
    return mode


class DenseRefresher:
    """Pull this section's dense tables from the servers into the global scope, every ``interval_s``."""

    def __init__(self, program, interval_s: float | None = None):
        import threading

        from paddle.distributed import fleet
        from paddle.distributed.ps.utils.public import get_the_one_recv_context

        self.rt = fleet.fleet._runtime_handle
        self.scope = paddle.static.global_scope()
        used = {n for blk in program.blocks for n in blk.vars}
        dense_map = get_the_one_recv_context(self.rt.context, split_dense_table=self.rt.is_heter_ps_mode)
        self.tables = {tid: names for tid, names in dense_map.items()
                       if names and all(n in used and self.scope.find_var(n) is not None for n in names)}
        ms = float(os.environ.get("HETERPS_DENSE_PULL_MS", "20"))
        self.interval_s = ms / 1000.0 if interval_s is None else interval_s
        self.pulls = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="heterps-dense-refresh", daemon=True)

    def start(self):
        if self.tables:
            self._thread.start()
        return self

    def pull_once(self):
        for tid, names in self.tables.items():
            self.rt._worker.pull_dense_params(self.scope, tid, names)
        self.pulls += 1
        if self.pulls == 1:
            print(f"heterps: dense refresh every {self.interval_s * 1000:.0f} ms for tables "
                  f"{ {t: n for t, n in self.tables.items()} }", flush=True)

    def _loop(self):
        while not self._stop.wait(self.interval_s):
            self.pull_once()

    def stop(self):
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        print(f"heterps: dense refresh: {self.pulls} pulls of tables {sorted(self.tables)}", flush=True)


def role() -> str:
    """'server' | 'trainer' | 'heter' from the launcher's environment."""
    r = os.environ.get("TRAINING_ROLE", "TRAINER")
    return {"PSERVER": "server", "HETER_TRAINER": "heter"}.get(r, "trainer")


def stage_id() -> int:
    return int(os.environ.get("STAGE_ID", "1"))


def heter_worker_dataset(program=None):
    """A one-slot QueueDataset for heterogeneous trainers.

    They read no data (micro-batches arrive from the previous stage), but the pipeline options Paddle
    sets (``is_fl_mode``) make ``train_from_dataset`` require a dataset object; its slot description
    must be valid or the data feed refuses to initialise.
    """
    program = program or paddle.static.default_main_program()
    block = program.global_block()
    name = "heterps_dummy_slot"
    var = block.vars.get(name) or block.create_var(name=name, shape=[-1, 1], dtype="int64", lod_level=1)
    ds = paddle.distributed.QueueDataset()
    ds.init(batch_size=1, thread_num=1, use_var=[var], pipe_command="cat")
    ds.set_filelist([])
    return ds


def _sparse_table_ids(runtime) -> dict[str, int]:
    ids = {}
    for ctx in runtime._send_ctx.values():
        if ctx.is_sparse():
            for grad in ctx.origin_varnames():
                ids[grad.split("@GRAD")[0]] = ctx.table_id()
    return ids


def distributed_eval_program(test_program, runtime):
    """A forward-only copy whose lookups read the servers' sparse tables (distributed_lookup_table)."""
    prog = test_program.clone(for_test=True)
    block = prog.global_block()
    table_ids = _sparse_table_ids(runtime)
    for idx in reversed(range(len(block.ops))):
        op = block.ops[idx]
        if op.type not in ("lookup_table", "lookup_table_v2") or not op.attr("remote_prefetch"):
            continue
        w = op.input("W")[0]
        attrs = {
            "is_distributed": op.attr("is_distributed"),
            "padding_idx": op.attr("padding_idx"),
            "table_id": table_ids[w],
            "lookup_table_version": op.type,
        }
        ids, out = op.input("Ids")[0], op.output("Out")[0]
        block._remove_op(idx)
        block._insert_op(idx, type="distributed_lookup_table",
                         inputs={"Ids": [block.var(ids)], "W": [block.var(w)]},
                         outputs={"Outputs": [block.var(out)]}, attrs=attrs)
    return prog


def sectioned_eval(exe, test_program, test_startup):
    """Held-out evaluation of a (sectioned or not) PS job on a CPU trainer, from the servers' parameters.

    ``test_program``/``test_startup``: the whole model's forward pass, cloned before ``minimize`` split
    it.  Returns (program, scope, dense var names pulled): run the program in the scope (exe.run or
    train_from_dataset); sparse rows are read from the servers' tables as it runs.
    """
    from paddle.distributed import fleet

    rt = fleet.fleet._runtime_handle
    prog = distributed_eval_program(test_program, rt)
    scope = paddle.static.Scope()
    with paddle.static.scope_guard(scope):
        exe.run(test_startup)
    return prog, scope, pull_dense_into(scope, rt)


def pull_dense_into(scope, runtime) -> list[str]:
    """Copy every dense table from the servers into ``scope`` (its vars must exist there)."""
    from paddle.distributed.ps.utils.public import get_the_one_recv_context

    dense_map = get_the_one_recv_context(runtime.context, split_dense_table=runtime.is_heter_ps_mode)
    names = []
    for table_id, var_names in dense_map.items():
        runtime._worker.pull_dense_params(scope, table_id, var_names)
        names.extend(var_names)
    return names


# ----------------------------------------------------------------------------------------------------
# Fault watchdog.
#
# Paddle 2.6.2's legacy PS launcher waits only for the CPU trainers and ignores exit codes; a trainer
# whose heterogeneous peer died (or never started) blocks forever inside C++ (init_worker's
# wait_server_ready, or a send_and_recv with no answer).  The watchdog runs in every process of a
# sectioned job, probes the TCP endpoints of the processes this one depends on, and when one is gone it
# prints a line naming the stage and process and ends this process, so the launcher tears the job down.
# ----------------------------------------------------------------------------------------------------

import re
import socket
import sys
import threading
import time

FATAL_TAG = "HETERPS-FATAL"
IDENTITY_TAG = "process:"
WATCHDOG_EXIT_CODE = 17


def _split_eps(value: str | None) -> list[str]:
    return [e for e in (value or "").split(",") if e]


def peer_endpoints(env=None) -> list[tuple[str, str]]:
    """(description, endpoint) of the processes this process cannot work without."""
    env = os.environ if env is None else env
    peers = [(f"parameter server {i} ({ep})", ep) for i, ep in enumerate(_split_eps(env.get(
        "PADDLE_PSERVERS_IP_PORT_LIST")))]
    heter = _split_eps(env.get("PADDLE_ALL_HETER_TRAINER_IP_PORT_LIST"))
    counts = [int(x) for x in re.findall(r"\d+", env.get("PADDLE_STAGE_TRAINERS_NUM", ""))][1:]
    my_stage = int(env.get("STAGE_ID", "1"))
    pos = 0
    for stage_offset, n in enumerate(counts):
        stage = stage_offset + 2
        for i in range(n):
            if pos < len(heter) and stage > my_stage:
                # A stage depends on every later stage: its micro-batches' gradients come back through them.
                peers.append((f"stage {stage} heterogeneous trainer {i} ({heter[pos]})", heter[pos]))
            pos += 1
    return peers


def _reachable(ep: str, timeout: float = 1.0) -> bool:
    host, port = ep.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            return True
    except OSError:
        return False


class Watchdog:
    """Probe peers every ``interval`` s; fatal when one never comes up within ``startup_timeout`` s or
    stops answering for ``misses`` probes in a row after it was up."""

    def __init__(self, peers, startup_timeout: float, interval: float = 1.0, misses: int = 3,
                 on_fatal=None):
        self.peers = list(peers)
        self.startup_timeout = startup_timeout
        self.interval = interval
        self.misses = misses
        self.on_fatal = on_fatal or _exit_fatal
        self.armed = True
        self._seen = set()
        self._missed = {}
        self._t0 = time.monotonic()
        self._thread = threading.Thread(target=self._loop, name="heterps-watchdog", daemon=True)

    def start(self):
        self._thread.start()
        return self

    def check_once(self):
        """One round of probes; returns a fatal message or None."""
        if not self.armed:
            return None
        dead, missing = [], []
        for desc, ep in self.peers:
            if _reachable(ep):
                self._seen.add(ep)
                self._missed[ep] = 0
            elif ep in self._seen:
                self._missed[ep] = self._missed.get(ep, 0) + 1
                if self._missed[ep] >= self.misses:
                    dead.append(desc)
            else:
                missing.append(desc)
        me = describe_self()
        if dead:
            return (f"{FATAL_TAG}: {me}: {'; '.join(dead)} stopped answering "
                    f"(process died or was killed); stopping this job instead of waiting forever")
        if missing and time.monotonic() - self._t0 > self.startup_timeout:
            return (f"{FATAL_TAG}: {me}: {'; '.join(missing)} never started within "
                    f"{self.startup_timeout:.0f} s (HETERPS_STARTUP_TIMEOUT); stopping this job")
        return None

    def _loop(self):
        while True:
            time.sleep(self.interval)
            msg = self.check_once()
            if msg:
                self.on_fatal(msg)
                return


def describe_self(env=None) -> str:
    env = os.environ if env is None else env
    r = env.get("TRAINING_ROLE", "TRAINER")
    ep = f"{env.get('POD_IP', '?')}:{env.get('PADDLE_PORT', '?')}"
    if r == "HETER_TRAINER":
        stage = int(env.get("STAGE_ID", "0"))
        index = "?"
        for desc, peer in peer_endpoints({**env, "STAGE_ID": "1"}):
            if peer == ep and desc.startswith(f"stage {stage} "):
                index = desc.split()[4]
        return f"stage {stage} heterogeneous trainer {index} {ep} (pid {os.getpid()})"
    return f"stage 1 CPU trainer {env.get('PADDLE_TRAINER_ID', '?')} {ep} (pid {os.getpid()})"


def _exit_fatal(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)
    print(msg, file=sys.stdout, flush=True)
    # The main thread is blocked in C++ (no Python exception can reach it): end the process; the
    # launcher then stops the rest of the job.
    os._exit(WATCHDOG_EXIT_CODE)


_watchdog: dict = {}


def start_watchdog() -> Watchdog | None:
    """Start the watchdog once per process (trainers and heterogeneous trainers of a sectioned job)."""
    if role() == "server" or "STAGE_NUM" not in os.environ or os.environ.get("HETERPS_WATCHDOG") == "0":
        return None
    if "dog" in _watchdog:
        return _watchdog["dog"]
    timeout = float(os.environ.get("HETERPS_STARTUP_TIMEOUT", "120"))
    peers = peer_endpoints()
    # Names this process in its log: the launch wrapper reads it to say which stage a dead log belongs to.
    print(f"heterps: {IDENTITY_TAG} {describe_self()}; watching {len(peers)} peers", flush=True)
    dog = Watchdog(peers, startup_timeout=timeout).start()
    _watchdog["dog"] = dog
    return dog


_refresh: dict = {}  # the dense refresher of the train_from_dataset running now (dropin's takeover stops it)


def _wrap_train_from_dataset() -> None:
    """Around each ``train_from_dataset`` of a sectioned job: refresh dense parameters while it runs
    (fix 5, ``pull`` mode), and disarm a CPU trainer's watchdog when its own training is over (its
    peers then go away because the job is ending, not because something failed)."""
    exe_cls = paddle.static.Executor
    if getattr(exe_cls.train_from_dataset, "_heterps_wrapped", False):
        return
    original = exe_cls.train_from_dataset

    def train_from_dataset(self, program=None, dataset=None, scope=None, *args, **kwargs):
        from heterps_paddle.runtime import dropin

        if dropin.is_whole_forward(program):
            # forward_only_program of a section: the pre-split forward pass, run with the servers' model
            return dropin.run_heldout(self, original, program, dataset, scope, args, kwargs)
        if getattr(program, "_heter_pipeline_opt", None) is None:
            return original(self, program, dataset, scope, *args, **kwargs)  # not a section
        if args:  # Executor.train_from_dataset's parameters after scope, given positionally
            kwargs.update(zip(("thread", "debug", "fetch_list", "fetch_info", "print_period", "fetch_handler"), args))
            args = ()
        if role() == "trainer":
            # A script written for the unsplit program fetches the loss and AUC, which a later stage computes.
            kwargs["fetch_list"], kwargs["fetch_info"] = dropin.section_fetch(
                program, kwargs.get("fetch_list"), kwargs.get("fetch_info"))
        dog = _watchdog.get("dog")
        if dog is not None:
            dog.armed = True
        refresher = None
        if dense_refresh_mode() == "pull":
            prog = program if program is not None else paddle.static.default_main_program()
            refresher = DenseRefresher(prog).start()
            _refresh["current"] = refresher
        try:
            return original(self, program, dataset, scope, *args, **kwargs)
        finally:
            if refresher is not None:
                refresher.stop()
            if dog is not None and role() == "trainer":
                dog.armed = False

    train_from_dataset._heterps_wrapped = True
    exe_cls.train_from_dataset = train_from_dataset
