"""``heterps launch --metrics-port P``: the job's figures in the Prometheus text format, on this host's address
(docs/metrics.md lists the metrics).

The figures are the host's event log's (launch/figures.py), the same ``heterps status`` prints: folded as the log
grows, at each scrape.  Read-only, and bounded like the control port: at most MAX_CONNECTIONS at once (more are
closed unanswered), a request's line and headers at most MAX_REQUEST bytes read within REQUEST_S seconds, one
request a connection; only ``GET /metrics`` (and ``GET /``) is answered with figures, anything else with an HTTP
error and nothing of the job.  No key, path or command line is in what it serves.

The text format is prometheus_client's (its metric families and ``generate_latest``): its escaping and its rules for
names and types, rather than a hand-written writer's.
"""

from __future__ import annotations

import socket
import socketserver
import threading
import time
from typing import Any, Iterator

from prometheus_client.core import CollectorRegistry, CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from heterps_paddle.launch.figures import JobFigures
from heterps_paddle.launch.state import Kind

MAX_CONNECTIONS = 64
MAX_REQUEST = 8192  # bytes of a request line and its headers
REQUEST_S = 5.0
STAGE_LABELS = ("stage", "resource", "kind")
TRAINER_LABELS = ("host", "index")


class _Figures:
    """The collector: this host's job figures, folded from its log at each scrape."""

    def __init__(self, log_dir: str):
        self.log_dir = log_dir
        self.figures = JobFigures()
        self.lock = threading.Lock()

    def collect(self) -> Iterator[Metric]:
        with self.lock:
            d = self.figures.read(self.log_dir).to_dict()
            rounds = list(self.figures.rounds)
        yield _gauge(
            "heterps_job_running",
            "1 while the job runs, 0 once it ended (or this host left it)",
            1 if d["state"] in ("starting", "running") else 0,
        )
        yield _gauge("heterps_job_round", "the round the job is in (0: the first plan)", d["round"])
        changes = CounterMetricFamily(
            "heterps_rounds", "changes of round since the job started, by kind", labels=["kind"]
        )
        for kind in Kind:  # every kind of round, adaptive moves included
            changes.add_metric([kind.value], sum(1 for r in rounds if r["kind"] == kind.value))
        yield changes
        if d["samples"] is not None:
            yield _counter("heterps_samples_trained", "samples the job trained so far (every round)", d["samples"])
        for name, help_text, key in (
            (
                "heterps_samples_per_second_last_window",
                "samples/s the job trained over the last window",
                "samples_per_s_last_window",
            ),
            ("heterps_seconds_over_job", "seconds since the job started (every round)", "seconds_over_job"),
            ("heterps_samples_per_second_over_job", "samples trained over the job's seconds", "samples_per_s_over_job"),
            (
                "heterps_cost_per_million_samples_over_job",
                "what the job cost so far over the samples it trained, per million",
                "cost_per_million_samples_over_job",
            ),
            ("heterps_samples_over_round", "samples the running round trained", "samples_over_round"),
            ("heterps_seconds_over_round", "seconds since the running round started", "seconds_over_round"),
            ("heterps_cost_over_round", "what the running round cost so far", "cost_over_round"),
            (
                "heterps_samples_per_second_over_round",
                "samples the running round trained over its seconds",
                "samples_per_s_over_round",
            ),
            (
                "heterps_cost_per_million_samples_over_round",
                "what the running round cost over the samples it trained, per million",
                "cost_per_million_samples_over_round",
            ),
            ("heterps_predicted_samples_per_second", "samples/s the running plan predicts", "predicted_samples_per_s"),
            (
                "heterps_target_samples_per_second",
                "the throughput target the plan was made for",
                "target_samples_per_s",
            ),
            (
                "heterps_cost_per_hour",
                "the running plan's price per hour (the cluster file's currency)",
                "cost_per_hour",
            ),
            (
                "heterps_cost_per_million_samples_last_window",
                "cost per hour over the samples trained per hour at the last window's rate",
                "cost_per_million_samples_last_window",
            ),
            (
                "heterps_idle_cost_per_hour",
                "of the cost per hour, the hosts held that run nothing of the round",
                "idle_cost_per_hour",
            ),
            ("heterps_rates_window_seconds", "the window the rates were measured over", "window_s"),
        ):
            if d[key] is not None:
                yield _gauge(name, help_text, d[key])
        if d["cost_so_far"] is not None:
            yield _counter("heterps_cost", "what the job cost so far (the cluster file's currency)", d["cost_so_far"])
        learning = d["learning"] or {}
        if learning.get("auc") is not None:
            yield _gauge("heterps_pass_auc", "the last finished pass's AUC (the model's own AUC op)", learning["auc"])
        if learning.get("loss") is not None:
            yield _gauge(
                "heterps_pass_loss", "the last finished pass's loss (the last stage's, where known)", learning["loss"]
            )
        if learning:
            yield _gauge(
                "heterps_not_learning",
                "1 when the last pass trained on values not finite, or its AUC is within 0.01 of 0.5 after the first",
                1 if learning.get("verdict") else 0,
            )
        if d["measured_at"] is not None:
            yield _gauge(
                "heterps_measurement_age_seconds",
                "seconds since the newest rates",
                max(0.0, time.time() - d["measured_at"]),
            )
        families = {
            "samples_per_s": GaugeMetricFamily(
                "heterps_stage_samples_per_second", "samples/s the stage trained over the window", labels=STAGE_LABELS
            ),
            "predicted_samples_per_s": GaugeMetricFamily(
                "heterps_stage_predicted_samples_per_second",
                "samples/s the plan predicts for the stage",
                labels=STAGE_LABELS,
            ),
            "work_share": GaugeMetricFamily(
                "heterps_stage_work_ratio",
                "share of the window the stage's processes worked (the rest they waited)",
                labels=STAGE_LABELS,
            ),
            "capacity_samples_per_s": GaugeMetricFamily(
                "heterps_stage_capacity_samples_per_second",
                "what the stage could train alone: its rate over its work ratio",
                labels=STAGE_LABELS,
            ),
            "units": GaugeMetricFamily(
                "heterps_stage_units", "units of its resource type the stage runs on", labels=STAGE_LABELS
            ),
            "price_per_hour": GaugeMetricFamily(
                "heterps_stage_unit_price_per_hour",
                "the price per hour of one unit of the stage's type",
                labels=STAGE_LABELS,
            ),
        }
        for stage in d["stages"]:
            labels = [str(stage.get("stage")), str(stage.get("resource")), str(stage.get("kind"))]
            for key, family in families.items():
                if stage.get(key) is not None:
                    family.add_metric(labels, float(stage[key]))
        yield from families.values()
        trainers = {
            "samples_per_s": GaugeMetricFamily(
                "heterps_trainer_samples_per_second",
                "samples/s a stage 1 trainer trained over the window",
                labels=TRAINER_LABELS,
            ),
            "share_of_peers": GaugeMetricFamily(
                "heterps_trainer_peer_ratio",
                "a stage 1 trainer's samples/s over its peers' median in the same pass",
                labels=TRAINER_LABELS,
            ),
            "slow": GaugeMetricFamily(
                "heterps_trainer_slow",
                "1 when a stage 1 trainer is under HETERPS_STRAGGLER_SHARE of its peers'",
                labels=TRAINER_LABELS,
            ),
        }
        for trainer in d["trainers"]:
            labels = [str(trainer.get("host")), str(trainer.get("index"))]
            for key, family in trainers.items():
                if trainer.get(key) is not None:
                    family.add_metric(labels, float(trainer[key]))
        yield from trainers.values()


def _gauge(name: str, help_text: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, help_text, value=float(value))


def _counter(name: str, help_text: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, help_text, value=float(value))


class MetricsServer:
    """Serves the figures of ``log_dir``'s job on ``address:port`` (module doc)."""

    def __init__(self, address: str, port: int, log_dir: str):
        self.address, self.port = address, port
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Figures(log_dir))
        self.server: socketserver.ThreadingTCPServer | None = None
        self.served: set[Any] = set()  # the connections being served (at most MAX_CONNECTIONS)
        self.lock = threading.Lock()

    def start(self) -> MetricsServer:
        """OSError when the port cannot be served (taken, or not this host's address)."""
        serving = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                serving._serve(self.request)

        class Server(socketserver.ThreadingTCPServer):
            allow_reuse_address = True
            daemon_threads = True

            def verify_request(self, request: Any, client_address: Any) -> bool:
                with serving.lock:
                    if len(serving.served) >= MAX_CONNECTIONS:
                        return False
                    serving.served.add(request)
                return True

            def shutdown_request(self, request: Any) -> None:
                # socketserver shuts a refused request too: only one being served frees a place (counting the
                # refused ones down had let about half of a flood past the bound)
                with serving.lock:
                    serving.served.discard(request)
                super().shutdown_request(request)

        self.server = Server((self.address, self.port), Handler)
        threading.Thread(target=self.server.serve_forever, name="heterps-metrics", daemon=True).start()
        return self

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()

    def _serve(self, conn: socket.socket) -> None:
        conn.settimeout(REQUEST_S)
        data = b""
        deadline = time.monotonic() + REQUEST_S
        try:
            while b"\r\n\r\n" not in data and b"\n\n" not in data:
                if len(data) > MAX_REQUEST:
                    return _answer(conn, 431, "Request Header Fields Too Large", b"")
                if time.monotonic() > deadline:
                    return _answer(conn, 408, "Request Timeout", b"")
                chunk = conn.recv(4096)
                if not chunk:
                    return
                data += chunk
            line = data.split(b"\n", 1)[0].strip().split()
            if len(line) != 3 or not line[2].startswith(b"HTTP/"):
                return _answer(conn, 400, "Bad Request", b"")
            method, path = line[0], line[1].split(b"?", 1)[0]
            if method != b"GET":
                return _answer(conn, 405, "Method Not Allowed", b"")
            if path == b"/metrics":
                return _answer(conn, 200, "OK", generate_latest(self.registry), CONTENT_TYPE_LATEST)
            if path == b"/":
                return _answer(conn, 200, "OK", b"heterps: the job's figures are at /metrics\n")
            return _answer(conn, 404, "Not Found", b"")
        except OSError:
            return None


def _answer(conn: socket.socket, code: int, reason: str, body: bytes, kind: str = "text/plain; charset=utf-8") -> None:
    head = (
        f"HTTP/1.1 {code} {reason}\r\nContent-Type: {kind}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    conn.sendall(head.encode() + body)
