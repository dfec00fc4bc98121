"""One table of our CUDA table against HierarchicalKV, from the logs hkv_compare.sh wrote:

    python3 custom_ops/bench/hkv_compare.py [--json] LOG_DIR

LOG_DIR holds hkv-DIM.json (custom_ops/bench/hkv_driver.cu: one JSON line) and ours-DIM.json (table_bench's
JSON) for each dim.  Rates are billions of keys per second (10^9); ratios are ours / HKV's, and the goals of
issue 13 are find >= HKV find, pull >= HKV find_or_insert, push >= 0.5 x HKV assign."""

import argparse
import json
import pathlib
import re
from typing import Any


def load(log_dir: pathlib.Path) -> list[dict[str, Any]]:
    rows = []
    for hkv_file in sorted(log_dir.glob("hkv-*.json"), key=lambda p: int(re.findall(r"\d+", p.name)[0])):
        dim = int(re.findall(r"\d+", hkv_file.name)[0])
        ours_file = log_dir / f"ours-{dim}.json"
        if not ours_file.exists():
            continue
        hkv = json.loads(hkv_file.read_text().strip().splitlines()[-1])
        ours = json.loads(ours_file.read_text())
        tp = ours["throughput"]
        uni = tp["uniform"]
        zipf = next((v for k, v in tp.items() if k.startswith("zipf_")), None)
        row: dict[str, Any] = {
            "dim": dim,
            "rows": tp["rows"],
            "hkv_capacity": hkv["capacity"],
            "hkv_find": hkv["find_keys_per_s"] / 1e9,
            "hkv_find_or_insert": hkv["find_or_insert_keys_per_s"] / 1e9,
            "hkv_assign": hkv["assign_keys_per_s"] / 1e9,
            "hkv_insert_or_assign": hkv["insert_or_assign_keys_per_s"] / 1e9,
            "find": uni["find_keys_per_s"] / 1e9,
            "find_hit60": uni["find_hit60_keys_per_s"] / 1e9,
            "pull": uni["pull_keys_per_s"] / 1e9,
            "push": uni["push_keys_per_s"] / 1e9,
        }
        if zipf is not None:
            row.update(
                zipf_unique=zipf["unique_ids"],
                zipf_find=zipf["find_keys_per_s"] / 1e9,
                zipf_pull=zipf["pull_keys_per_s"] / 1e9,
                zipf_push=zipf["push_keys_per_s"] / 1e9,
            )
        row["find_ratio"] = row["find_hit60"] / row["hkv_find"]
        row["pull_ratio"] = row["pull"] / row["hkv_find_or_insert"]
        row["push_ratio"] = row["push"] / row["hkv_assign"]
        row["goals_met"] = {
            "find >= HKV find (60% present both)": row["find_ratio"] >= 1.0,
            "pull >= HKV find_or_insert": row["pull_ratio"] >= 1.0,
            "push >= 0.5 x HKV assign": row["push_ratio"] >= 0.5,
        }
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("log_dir", type=pathlib.Path)
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = parser.parse_args()
    rows = load(args.log_dir)
    gpu = (args.log_dir / "gpu.txt").read_text().strip() if (args.log_dir / "gpu.txt").exists() else "unknown"
    if args.json:
        print(json.dumps({"gpu": gpu, "rows": rows}, indent=1))
        return
    print(f"GPU: {gpu}; billions of keys/s, 2^20 keys a call; ratio = ours / HKV")
    head = (
        "| dim | rows | find (all / 60% present) | HKV find (60%) | ratio | pull | HKV find_or_insert | ratio "
        "| push | HKV assign | ratio | Zipf unique ids | Zipf find / pull / push |"
    )
    print(head)
    print("|" + " --- |" * (head.count("|") - 1))
    for r in rows:
        zipf = (
            f"{r['zipf_unique']:,} | {r['zipf_find']:.2f} / {r['zipf_pull']:.2f} / {r['zipf_push']:.2f}"
            if "zipf_find" in r
            else "- | -"
        )
        print(
            f"| {r['dim']} | {r['rows']:,} | {r['find']:.2f} / {r['find_hit60']:.2f} | {r['hkv_find']:.2f} "
            f"| {r['find_ratio']:.2f} | {r['pull']:.2f} | {r['hkv_find_or_insert']:.2f} | {r['pull_ratio']:.2f} "
            f"| {r['push']:.2f} | {r['hkv_assign']:.2f} | {r['push_ratio']:.2f} | {zipf} |"
        )
    missed = [(r["dim"], goal) for r in rows for goal, met in r["goals_met"].items() if not met]
    print("goals missed: " + ("; ".join(f"dim {d}: {g}" for d, g in missed) if missed else "none"))


if __name__ == "__main__":
    main()
