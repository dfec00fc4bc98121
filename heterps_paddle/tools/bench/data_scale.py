"""``heterps bench data --scale``: the job's data plan at the size of a day of production data, with simulated
trainers (issue 60, item 4).

For each of 1,000, 10,000 and 100,000 shards a pass and 10, 100 and 1,000 stage 1 CPU trainers, a fresh process
builds the real :class:`~heterps_paddle.data_plan.DataPlan` and drives two passes through it: each trainer offers
its share of the files (a sharded script: file k to trainer k mod T; offers paged under the control line's
limit), then takes, reports progress half-way through a call of more than 5 s, finishes, and takes again, on a
simulated clock at its own pace (a tenth of the trainers at a tenth of the others' pace, as a slowed host); in
pass 2 a checkpoint is asked for half-way, the trainers meet, and trainer 0 reads the done list in pages.  Every
request and reply goes through JSON as on the control connection (``json.dumps`` to a line, ``json.loads`` back):
a take's latency is that round trip with the plan's answer, on this machine's clock.  The coordinator's own
connection handling (TLS-less HMAC lines, a thread a connection: bench control measures it) is not included.

Printed per size: a take's p50/p99/max (ms), the plan's CPU seconds, the process's peak memory, the bytes of
requests and replies and the longest line, the pages of the offers and of the done list, what a files board's
whole-state rewrite would cost at mid-pass (to_json and from_json) against its journal (data_plan/journal.py, two
processes' views), and the passes' simulated length over an ideal
one (every byte at the sum of the paces): how well the plan balanced.  The baseline in the same run: the same
messages' JSON round trip without the plan (``json_take_p50_ms``).

No Paddle: the plan is pure Python.
"""

from __future__ import annotations

import argparse
import hashlib
import heapq
import json
import os
import resource
import subprocess
import sys
import time
from typing import Any, Mapping, Sequence

from heterps_paddle.control import MAX_LINE
from heterps_paddle.data_plan import DataPlan
from heterps_paddle.errors import HeterPSError

SHARDS = (1_000, 10_000, 100_000)
TRAINERS = (10, 100, 1_000)
TAKE_P99_GOAL_MS = 50.0  # a take at 100,000 shards and 1,000 trainers
PACE = 50e6  # bytes a second of a calm trainer
SLOWED = 0.1  # a slowed trainer's pace over a calm one's (every tenth trainer)
WANT = 2  # reader threads a trainer
PAGE_BYTES = MAX_LINE * 3 // 4  # an offer page's line, under the control line's limit
WAIT_S = 1.0  # a trainer told to wait asks again after this


def file_names(shards: int, seed: int = 7) -> list[str]:
    """``shards`` content names of files of 1-100 MB (sizes from a digest of their index: the same every run)."""
    out = []
    for k in range(shards):
        digest = hashlib.sha256(f"{seed}:{k}".encode()).hexdigest()
        size = 1_000_000 + int(digest[:8], 16) % 99_000_000
        out.append(f"part-{k:06d}:{size}:s-{digest}")
    return out


class Wire:
    """The plan behind a JSON line each way, timed: the requests' and replies' bytes, each take's seconds."""

    def __init__(self, plan: DataPlan) -> None:
        self.plan = plan
        self.sent = self.received = self.longest = 0
        self.takes: list[float] = []
        self.take_cpu: list[float] = []  # the same takes' CPU seconds: what preemption on a busy machine leaves out
        self.json_takes: list[float] = []
        self.cpu = 0.0
        self.counts: dict[str, int] = {}

    def ask(self, message: dict[str, Any]) -> dict[str, Any]:
        start, cpu = time.perf_counter(), time.process_time()
        line = json.dumps({"op": "shards", **message})
        reply = self.plan.answer(json.loads(line))
        back = json.dumps(reply)
        out: dict[str, Any] = json.loads(back)
        took, cpu = time.perf_counter() - start, time.process_time() - cpu
        self.cpu += cpu
        do = str(message["do"])
        self.counts[do] = self.counts.get(do, 0) + 1
        self.sent += len(line) + 1
        self.received += len(back) + 1
        self.longest = max(self.longest, len(line) + 1, len(back) + 1)
        if do == "take":
            self.takes.append(took)
            self.take_cpu.append(cpu)
            start = time.perf_counter()
            json.loads(json.dumps(reply))
            json.loads(json.dumps({"op": "shards", **message}))
            self.json_takes.append(time.perf_counter() - start)
        if "error" in out:
            raise HeterPSError(f"bench data --scale: the plan refused {do}: {out['error']}")
        return out


def offer_pages(files: list[list[str]], budget: int = PAGE_BYTES) -> list[list[list[str]]]:
    """``files`` cut into pages whose JSON stays within ``budget`` bytes."""
    pages: list[list[list[str]]] = [[]]
    size = 0
    for pair in files:
        cost = len(pair[0]) + len(pair[1]) + 8
        if pages[-1] and size + cost > budget:
            pages.append([])
            size = 0
        pages[-1].append(pair)
        size += cost
    return pages


def plan_files(names: list[str], trainers: int, requests: int = 400) -> dict[str, Any]:
    """A files board's data plan (data_plan/journal.py) at this size: two processes' views of the files, each
    replaying the other's lines; the offers, then ``requests`` takes and finishes alternating between the views
    (ms a request: its own answer and the catch-up on the other's)."""
    import tempfile

    from heterps_paddle.data_plan.journal import PlanFiles

    with tempfile.TemporaryDirectory(prefix="heterps-plan-files-") as directory:
        views = [PlanFiles(directory), PlanFiles(directory)]
        start = time.perf_counter()
        for t in range(trainers):
            files = [[n, f"/data/{n[:11]}"] for n in names[t::trainers]]
            for index, page in enumerate(offer_pages(files)):
                message = {"do": "offer", "pass": 1, "trainers": trainers, "trainer": t, "files": page}
                views[t % 2].answer({**message, "page": index, "pages": len(offer_pages(files)), "now": 0.0})
        offers_s = time.perf_counter() - start
        took = []
        for k in range(requests // 2):
            t = k % trainers
            start = time.perf_counter()
            reply = views[k % 2].answer({"do": "take", "pass": 1, "trainer": t, "now": float(k)})
            held = [n for n, _ in reply.get("shards", [])]
            views[(k + 1) % 2].answer({"do": "finish", "pass": 1, "trainer": t, "shards": held, "now": k + 0.5})
            took.append((time.perf_counter() - start) / 2)
        took.sort()
        return {
            "offers_s": round(offers_s, 2),
            "request_p50_ms": round(took[len(took) // 2] * 1e3, 3),
            "request_p99_ms": round(took[int(len(took) * 0.99)] * 1e3, 3),
            "generations": views[0].generation,
        }


def simulate(shards: int, trainers: int) -> dict[str, Any]:
    """Two passes of ``shards`` files over ``trainers`` simulated trainers (module doc); the figures."""
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    names = file_names(shards)
    sizes = [int(n.split(":")[1]) for n in names]
    paces = [PACE * (SLOWED if t % 10 == 0 else 1.0) for t in range(trainers)]
    wire = Wire(DataPlan())
    report: dict[str, Any] = {"shards": shards, "trainers": trainers, "passes": []}
    clock = 0.0
    for number in (1, 2):
        offers = {t: [] for t in range(trainers)}  # type: dict[int, list[list[str]]]
        for k, name in enumerate(names):
            offers[k % trainers].append([name, f"/data/host-{k % trainers}/{name.split(':')[0]}"])
        pages = 0
        for t in range(trainers):
            cut = offer_pages(offers[t])
            for index, page in enumerate(cut):
                message = {"do": "offer", "pass": number, "trainers": trainers, "trainer": t, "files": page}
                wire.ask({**message, "page": index, "pages": len(cut), "now": clock})
            pages += len(cut)
        start = clock
        events = [(clock, t, "take", 0) for t in range(trainers)]
        heapq.heapify(events)
        held: dict[int, list[str]] = {}
        ended = met = 0
        checkpoint = {"asked": False, "done_pages": 0, "done_names": 0}
        done_in_pass = 0
        while events:
            clock, t, action, trained = heapq.heappop(events)
            if action == "progress":
                wire.ask({"do": "progress", "pass": number, "trainer": t, "bytes": trained, "now": clock})
                continue
            if action == "finish":
                wire.ask({"do": "finish", "pass": number, "trainer": t, "shards": held.pop(t), "now": clock})
                done_in_pass += trained
                if number == 2 and not checkpoint["asked"] and done_in_pass >= shards // 2:
                    checkpoint["asked"] = True
                    wire.ask({"do": "hold", "pass": number, "ask": "bench", "now": clock})
            reply = wire.ask({"do": "take", "pass": number, "trainer": t, "want": WANT, "now": clock})
            if "shards" in reply:
                held[t] = [name for name, _ in reply["shards"]]
                call = sum(sizes[int(name[5:11])] for name in held[t])
                seconds = call / paces[t]
                if seconds > 5.0:
                    heapq.heappush(events, (clock + seconds / 2, t, "progress", call // 2))
                heapq.heappush(events, (clock + seconds, t, "finish", len(held[t])))
            elif "wait" in reply:
                heapq.heappush(events, (clock + WAIT_S, t, "take", 0))
            elif "meet" in reply:
                met += 1
                if met == trainers:  # every trainer holds none: trainer 0 reads the done list, in pages
                    at: int | None = 0
                    while at is not None:
                        done = wire.ask({"do": "done", "pass": number, "from": at, "now": clock})
                        checkpoint["done_pages"] += 1
                        checkpoint["done_names"] += len(done["done"])
                        at = done["next"]
                    report["plan_peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
                    mid = time.perf_counter()
                    state = json.dumps(wire.plan.to_json())
                    dumped = time.perf_counter() - mid
                    mid = time.perf_counter()
                    DataPlan.from_json(json.loads(state))
                    report["files_board"] = {
                        "state_bytes": len(state),
                        "to_json_ms": round(dumped * 1e3, 1),
                        "from_json_ms": round((time.perf_counter() - mid) * 1e3, 1),
                    }
                heapq.heappush(events, (clock, t, "take", 0))
            else:
                ended += 1
        ideal = sum(sizes) / sum(paces)
        report["passes"].append(
            {
                "number": number,
                "offer_pages": pages,
                "simulated_s": round(clock - start, 1),
                "over_ideal": round((clock - start) / ideal, 3),
                "ended": ended,
                **{k: v for k, v in checkpoint.items() if number == 2},
            }
        )
    report["peak_rss_mb_before_files_board"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    report.setdefault("files_board", {})["journal"] = plan_files(names, trainers)
    takes = sorted(wire.takes)
    report.update(
        requests=wire.counts,
        take_p50_ms=round(takes[len(takes) // 2] * 1e3, 3),
        take_p99_ms=round(takes[int(len(takes) * 0.99)] * 1e3, 3),
        take_max_ms=round(takes[-1] * 1e3, 3),
        take_cpu_p50_ms=round(sorted(wire.take_cpu)[len(takes) // 2] * 1e3, 3),
        take_cpu_p99_ms=round(sorted(wire.take_cpu)[int(len(takes) * 0.99)] * 1e3, 3),
        json_take_p50_ms=round(sorted(wire.json_takes)[len(takes) // 2] * 1e3, 3),
        plan_cpu_s=round(wire.cpu, 2),
        rss_before_mb=round(rss_before / 1024, 1),
        request_bytes=wire.sent,
        reply_bytes=wire.received,
        longest_line=wire.longest,
    )
    return report


def run(args: argparse.Namespace) -> int:
    """Each size in a process of its own (its peak memory its own)."""
    sizes = [(s, t) for s in SHARDS for t in TRAINERS]
    runs = []
    for shards, trainers in sizes:
        print(f"bench data --scale: {shards} shards, {trainers} trainers ...", file=sys.stderr, flush=True)
        command = [sys.executable, "-m", "heterps_paddle.tools.bench.data_scale", str(shards), str(trainers)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout)
        if done.returncode != 0:
            raise HeterPSError(f"bench data --scale: {shards} x {trainers} ended {done.returncode}:\n{done.stderr}")
        runs.append(json.loads(done.stdout))
    largest = runs[-1]
    report = {
        "benchmark": "data --scale",
        "runs": runs,
        "goal": {"take_p99_ms": TAKE_P99_GOAL_MS, "at": [SHARDS[-1], TRAINERS[-1]]},
        "met": largest["take_p99_ms"] <= TAKE_P99_GOAL_MS,
        "cpu_count": os.cpu_count(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }
    print(json.dumps(report) if args.json else table(report))
    return 0


def table(report: Mapping[str, Any]) -> str:
    out = [
        "shards trainers | take p50 p99 max ms (CPU p99; JSON alone p50) | plan CPU s | peak MB | longest line | over ideal"
    ]
    for r in report["runs"]:
        out.append(
            f"{r['shards']:>6} {r['trainers']:>5} | {r['take_p50_ms']} {r['take_p99_ms']} {r['take_max_ms']} "
            f"({r['take_cpu_p99_ms']}; {r['json_take_p50_ms']}) | {r['plan_cpu_s']} | "
            f"{r['peak_rss_mb_before_files_board']} | {r['longest_line']} | "
            f"{' '.join(str(p['over_ideal']) for p in r['passes'])}"
        )
    goal = report["goal"]
    out.append(f"goal: a take's p99 <= {goal['take_p99_ms']} ms at {goal['at'][0]} x {goal['at'][1]}: {report['met']}")
    return "\n".join(out + [f"load average {report['load_average']}"])


def main(argv: Sequence[str]) -> int:
    print(json.dumps(simulate(int(argv[0]), int(argv[1]))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
