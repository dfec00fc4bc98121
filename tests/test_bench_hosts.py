"""``heterps bench hosts``: emulated hosts (network namespaces joined by a tc-shaped veth pair) and a tiny run of the
benchmark.  No timing is asserted (the machine is shared): only that the link is made and removed without a trace,
that it carries traffic, and that the benchmark prints its fields with sane values."""

import json
import os
import subprocess
import sys

import pytest

from heterps_paddle.tools.shaped_link import (
    ADDRESS_A,
    ADDRESS_C,
    LinkSetupError,
    ShapedLink,
    leftovers,
    list_namespaces,
    tool,
)

IP, TC = tool("ip") or "ip", tool("tc") or "tc"  # in sbin, which a plain PATH may leave out
can_shape = os.geteuid() == 0 and tool("ip") is not None and tool("tc") is not None
needs_root = pytest.mark.skipif(not can_shape, reason="emulated hosts need root and iproute2")


def links_of(prefix):
    """Interfaces of this machine's own namespace whose name is a link's device (none may ever be here)."""
    out = subprocess.run([IP, "-o", "link"], capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines() if prefix in line]


@needs_root
def test_link_is_made_shaped_and_removed(tmp_path):
    prefix = f"hpstest-{os.getpid()}-"
    link = ShapedLink(50, prefix=prefix)
    with link:
        assert sorted(leftovers(prefix)) == sorted(link.namespaces.values())
        assert links_of(link.devices[ADDRESS_A]) == []  # both ends live only inside the namespaces
        # a TCP connection from c to a (listening inside a's namespace): traffic both ways across the link
        serve = "import socket; s = socket.socket(); s.bind(('%s', 5001)); s.listen(1); s.accept()[0].recv(10)"
        server = subprocess.Popen([*link.prefix_command(ADDRESS_A), sys.executable, "-c", serve % ADDRESS_A])
        client = (
            "import socket, time\nfor _ in range(50):\n  try:\n    c = socket.create_connection(('%s', 5001)); "
            "c.sendall(b'x' * 10); break\n  except OSError: time.sleep(0.1)"
        )
        subprocess.run([*link.prefix_command(ADDRESS_C), sys.executable, "-c", client % ADDRESS_A], check=True)
        assert server.wait(timeout=30) == 0
        qdisc = subprocess.run(
            [TC, "-n", link.namespaces[ADDRESS_A], "qdisc", "show", "dev", link.devices[ADDRESS_A]],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert "tbf" in qdisc and "50Mbit" in qdisc, qdisc
        sent = link.sent_bytes()
        assert sent[ADDRESS_C] > 0 and sent[ADDRESS_A] > 0
    assert leftovers(prefix) == []
    assert not any(n.startswith(prefix) for n in list_namespaces())


@needs_root
def test_link_is_removed_when_set_up_fails():
    prefix = f"hpstest-{os.getpid()}-f-"
    link = ShapedLink(10, prefix=prefix)
    subprocess.run([IP, "netns", "add", link.namespaces[ADDRESS_C]], check=True)  # c's name is taken
    try:
        with pytest.raises(LinkSetupError, match="ip netns add"):
            with link:
                pass
    finally:
        subprocess.run([IP, "netns", "delete", link.namespaces[ADDRESS_C]], capture_output=True)
    assert leftovers(prefix) == []


def test_a_rate_must_be_positive():
    with pytest.raises(LinkSetupError, match="positive"):
        ShapedLink(0)


@needs_root
@pytest.mark.launched
def test_a_tiny_bench_hosts_run_prints_its_fields(tmp_path, heterps_cache):
    cmd = [sys.executable, "-m", "heterps_paddle", "bench", "hosts", "--rates", "50", "--rows", "600", "--epochs", "2"]
    bench = subprocess.Popen(
        [*cmd, "--work-dir", str(tmp_path), "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    try:
        stdout, stderr = bench.communicate(timeout=240)
    finally:
        bench.kill()
    assert bench.returncode == 0, stderr[-4000:]
    report = json.loads(stdout)
    assert report["benchmark"] == "hosts" and len(report["results"]) == 1
    row = report["results"][0]
    assert row["rate_mbit"] == 50
    assert row["measured_samples_per_second"] > 0 and row["predicted_samples_per_second"] > 0
    assert row["ratio"] == pytest.approx(row["measured_samples_per_second"] / row["predicted_samples_per_second"], 0.01)
    # the pipeline's reading (traffic overlapping compute) is never slower than the reference one (their sum)
    assert row["predicted_overlap_samples_per_second"] >= row["predicted_samples_per_second"]
    assert row["ratio_overlap"] == pytest.approx(
        row["measured_samples_per_second"] / row["predicted_overlap_samples_per_second"], 0.01
    )
    assert isinstance(row["link_bound"], bool) and 0 <= row["link_share"] <= 1
    # the boundary's activations crossed the link both ways: at least what the model counts one way
    crossed = row["measured"]["link_bytes_per_sample"]
    assert min(crossed.values()) > 0.25 * row["predicted"]["link_bytes_per_sample"], crossed
    assert 0.5 <= row["measured"]["heldout_auc"] <= 1
    # its namespaces are gone (named after its pid: another run's, e.g. a second suite on this machine, may exist)
    assert [n for n in list_namespaces() if n.startswith(f"hps-{bench.pid}-")] == []
