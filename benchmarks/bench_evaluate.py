"""Evaluation latency: median and p99 µs per evaluate() call.

Large case: 8 GPUs, 64 instances (8 per GPU, each with 5 runtime pools and an
elastic pool), 10 rules. Small case: 1 GPU, 4 instances. The controller
re-evaluates on every fact change, so this bounds how fast limits follow load.
Baseline in the same run: parsing the policy once (what a reload costs).

    python benchmarks/bench_evaluate.py [--runs N] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

from kvpolicy.evaluate.decide import evaluate, prepare
from kvpolicy.facts import Facts
from kvpolicy.lint.load import policy_from_text
from kvpolicy.units import GiB

POOLS = ("swa", "c4", "c128", "indexer", "compressor_state")


def policy_text(models: int, rules: int) -> str:
    lines = ["version 1", "defaults { headroom 2 GiB; chunk 2 MiB }"]
    for m in range(models):
        lines.append(f'model "model-{m}" {{')
        lines.append(f"  priority {m * 100 % 1000}; min {1 + m % 4} GiB; max {40 + m % 3 * 10}%; weight {100 + 50 * m}")
        lines += [f"  pool {p} {{ owner runtime; max 20 GiB }}" for p in POOLS]
        lines.append("}")
    conditions = [
        "gpu.free < 8 GiB and model.idle > 60s",
        "model.used > 30 GiB and model.priority < 300",
        "not (model.engine == vllm) and model.idle > 10m",
        "gpu.used > 100 GiB or model.idle > 1h",
        "(model.weight <= 200 and model.used > model.target) or gpu.free < 1 GiB",
    ]
    for r in range(rules):
        lines.append(f'rule "r{r}" {{')
        lines.append(f"  when {conditions[r % len(conditions)]}")
        lines.append("  order priority asc, idle desc")
        lines.append(f"  shrink to {'min' if r % 2 else 'target'}")
        lines.append(f"  grace {r}s; cooldown 1m")
        lines.append("}")
    return "\n".join(lines) + "\n"


def facts(gpus: int, per_gpu: int) -> Facts:
    instances = []
    for g in range(gpus):
        for k in range(per_gpu):
            n = g * per_gpu + k
            used = (3 + n % 7) * GiB
            instances.append({
                "id": f"inst-{n:02d}", "model": f"model-{n % 8}", "engine": "vllm" if n % 2 else "sglang",
                "gpu": f"cuda:{g}", "rank": 0, "pid": 1000 + n,
                "pools": {p: {"owner": "runtime", "bytes": (1 + (n + i) % 3) * 256 * 1024 * 1024} for i, p in enumerate(POOLS)},
                "elastic": {"used": used, "mapped": used}, "idle_seconds": float(n * 13 % 400),
            })
    return Facts.model_validate({
        "schema": 1, "now": 10_000.0,
        "gpus": [{"id": f"cuda:{g}", "capacity": 141 * GiB, "other_used": 3 * GiB} for g in range(gpus)],
        "instances": instances,
    })


def measure(fn, runs: int) -> tuple[float, float]:
    for _ in range(max(5, runs // 20)):
        fn()
    times = []
    for _ in range(runs):
        start = time.perf_counter_ns()
        fn()
        times.append((time.perf_counter_ns() - start) / 1000)
    times.sort()
    return statistics.median(times), times[min(len(times) - 1, int(len(times) * 0.99))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args()
    text = policy_text(models=8, rules=10)
    policy = prepare(policy_from_text(text, "bench.kvp"))  # as the controller holds it
    results = {}
    for name, gpus, per_gpu in (("8 GPUs x 8 instances, 10 rules", 8, 8), ("1 GPU x 4 instances, 10 rules", 1, 4)):
        f = facts(gpus, per_gpu)
        _, state = evaluate(policy, f)
        results[name] = measure(lambda: evaluate(policy, f, state), args.runs)  # noqa: B023 - measured in this iteration
    parse = measure(lambda: policy_from_text(text, "bench.kvp"), max(50, args.runs // 20))
    print(f"machine: {platform.machine()} {platform.processor() or ''} python {platform.python_version()}")
    print(f"{'case':<36}{'median µs':>12}{'p99 µs':>12}{'x parse':>10}")
    for name, (median, p99) in results.items():
        print(f"{name:<36}{median:>12.1f}{p99:>12.1f}{median / parse[0]:>10.2f}")
    print(f"{'baseline: parse + lint the policy':<36}{parse[0]:>12.1f}{parse[1]:>12.1f}{1.0:>10.2f}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"evaluate_us": {k: {"median": v[0], "p99": v[1]} for k, v in results.items()},
                       "parse_us": {"median": parse[0], "p99": parse[1]}}, out, indent=2)


if __name__ == "__main__":
    main()
