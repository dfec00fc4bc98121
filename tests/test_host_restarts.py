"""A job that loses a machine goes on (``heterps launch --hosts ... --restarts N --checkpoint-dir DIR``): on hosts
emulated on loopback addresses, as in tests/test_across_hosts.py.

Three hosts: the parameter server and a CPU trainer on the first, a CPU trainer on the second, the heterogeneous
stage on the third; the script is on the automatic path (a cluster file of this machine's types), checkpoints every
pass.  Once the first checkpoint is complete, the third host dies (its launch and every process on it SIGKILLed).
The coordinator re-plans for the two CPU hosts left (a one-stage plan is what fits), every host left starts again
from the checkpoint (the pass it holds is skipped, not redone), and the job ends 0 within 0.01 held-out AUC of the
same job undisturbed; restarts.json says what was lost, the old and the new plan.  ``--restarts 0`` (today's
behaviour) is tests/test_across_hosts.py's dead-host test.
"""

import json
import os
import re
import time

import pytest

from heterps_paddle.data.generator import generate
from heterps_paddle.tools.cli import main as heterps
from heterps_paddle.tools.jobs import HostsRun, free_port_block

pytestmark = pytest.mark.launched

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "paddlerec_style_trainer.py")
A, B, C = "127.0.0.2", "127.0.0.3", "127.0.0.4"
STAGES = [
    {"resource": "local_cpu", "kind": "cpu", "layers": ["embedding_0"], "units": 2},
    {"resource": "local_gpu", "kind": "gpu", "layers": ["fc_0", "fc_1", "fc_2"], "units": 1},
]


@pytest.fixture(scope="module")
def setup(tmp_path_factory, heterps_cache):
    tmp = tmp_path_factory.mktemp("restarts")
    data = str(tmp / "data")
    generate(data, 40000, seed=3, test_fraction=0.1)
    plan = tmp / "plan.json"
    plan.write_text(json.dumps({"format": 1, "feasible": True, "stages": STAGES}))
    cluster = str(tmp / "cluster.yaml")
    assert heterps(["local-cluster", "--out", cluster]) == 0
    return {"tmp": tmp, "data": data, "plan": str(plan), "cluster": cluster}


def run_job(setup, name, restarts):
    work = setup["tmp"] / name
    work.mkdir()
    hosts = work / "hosts.yaml"
    # one server: a checkpoint is then regrouped into the one-stage layout, which any later plan resumes from
    hosts.write_text(
        "format: 1\nhosts:\n"
        f"  - {{address: {A}, type: local_cpu, servers: 1, port: {free_port_block(A, 8)}}}\n"
        f"  - {{address: {B}, type: local_cpu, port: {free_port_block(B, 8)}}}\n"
        f"  - {{address: {C}, type: local_gpu, port: {free_port_block(C, 8)}}}\n"
    )
    argv = [SCRIPT, "--data", setup["data"], "--out", str(work / "out"), "--cluster", setup["cluster"]]
    run = HostsRun(
        str(hosts),
        setup["plan"],
        argv,
        str(work),
        launch_options=(
            "--devices",
            "cpu",
            "--restarts",
            str(restarts),
            "--checkpoint-dir",
            str(work / "checkpoints"),
            "--checkpoint-every",
            "1",
        ),
        env=dict(os.environ),
        timeout=400,
    )
    for address in (A, B, C):
        run.start(address)
    return run, work


def heldout(work):
    with open(os.path.join(work, "out", "worker-0.json")) as f:
        return json.load(f)["test_auc"]


def test_a_lost_heterogeneous_host_goes_on_from_the_checkpoint(setup):
    undisturbed, undisturbed_work = run_job(setup, "undisturbed", restarts=1)
    try:
        codes = undisturbed.wait()
        assert codes == {A: 0, B: 0, C: 0}, "\n".join(h.console()[-2000:] for h in undisturbed.hosts.values())
    finally:
        undisturbed.stop()

    run, work = run_job(setup, "disturbed", restarts=1)
    try:
        first = work / "checkpoints" / "pass-000001"
        deadline = time.monotonic() + 300
        while not (first / "heterps_checkpoint.json").exists() or not first.is_dir():
            assert time.monotonic() < deadline and all(h.returncode is None for h in run.hosts.values()), "\n".join(
                h.console()[-2000:] for h in run.hosts.values()
            )
            time.sleep(0.5)
        run.kill(C)
        codes = run.wait()
        consoles = {a: run.hosts[a].console() for a in (A, B)}
        assert codes[A] == 0 and codes[B] == 0, "\n".join(c[-4000:] for c in consoles.values())
    finally:
        run.stop()
    assert run.leftovers() == []

    # The restart: what was lost, the old and new plan, on the coordinator's console and in restarts.json.
    assert re.search(rf"restart 1 \(0 left\): lost {re.escape(C)}; .* -> 2 x local_cpu", consoles[A]), consoles[A][
        -4000:
    ]
    with open(os.path.join(run.hosts[A].log_dir, "restarts.json")) as f:
        (event,) = json.load(f)["restarts"]
    assert event["lost"] == [C] and event["new_plan"]["stages"] == ["2 x local_cpu (4 layers)"]
    assert len(event["old_plan"]["stages"]) == 2 and event["new_plan"]["predicted_samples_per_s"] > 0
    # Started again from the checkpoint: its pass skipped on both trainers, not redone.
    round1 = {a: run.hosts[a].logs() for a in (A, B)}
    for address in (A, B):
        logs = os.path.join(run.hosts[address].log_dir, "round1")
        with open(os.path.join(logs, "workerlog.0")) as f:
            assert "pass 1 skipped (train_from_dataset not run)" in f.read()
    with open(os.path.join(run.hosts[A].log_dir, "round1", "serverlog.0")) as f:
        assert "resuming from the launch's checkpoint" in f.read()
    del round1
    # Nothing lost: the job ends where the undisturbed one does.
    disturbed, calm = heldout(work), heldout(undisturbed_work)
    print(f"\nheld-out AUC: disturbed {disturbed:.4f}, undisturbed {calm:.4f}")
    assert abs(disturbed - calm) <= 0.01, f"disturbed {disturbed:.4f} vs undisturbed {calm:.4f}"
