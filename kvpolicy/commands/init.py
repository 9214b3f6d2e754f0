"""``kvpolicy init [FILE]``: write a commented starter policy (default ``policy.kvp``).

The starter lints clean: one GPU with headroom, DeepSeek-V4-Flash on SGLang with a
``reserve``, a vLLM model on an elastic pool with a guarantee, batch models that soak
up what is spare, and a rule that takes memory back from idle batch jobs. Edit the
names and sizes, then ``kvpolicy lint`` and ``kvpolicy explain`` it. An existing file
is left alone unless ``--force``; ``-`` writes the policy to standard output.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from kvpolicy.commands import Subcommands, add_format_option
from kvpolicy.paths import path_kind, reason

DEFAULT_FILE = "policy.kvp"

STARTER = """\
# A kvpolicy policy: how the engines on these GPUs share their memory.
# Language reference: docs/language.md; check it with `kvpolicy lint`, see what it
# decides for your GPUs with `kvpolicy explain` (docs/semantics.md).
version 1

# Every GPU (or one by id: gpu "cuda:0" { ... }). Capacity comes from the GPU itself;
# headroom is never handed out: CUDA graphs, NCCL buffers, activation peaks.
gpu * {
  headroom 6 GiB
}

# DeepSeek-V4 on SGLang: its pools (SWA, C4, C128, indexer, compressor state) are
# runtime-owned and sized once, at start, from `reserve`; the engine refuses to
# start without one. `kvpolicy plan --policy` shows what a reserve buys.
model "deepseek-v4-flash" {
  engine sglang
  priority 100
  reserve 34 GiB
}

# A vLLM model on an elastic pool: kvpolicy's allocator maps its KV cache on demand,
# guaranteeing `min`, never beyond `max`, sharing what is spare by `weight`.
model "qwen3-8b" {
  engine vllm
  priority 50
  min 8 GiB   # guaranteed, even when other models are busy
  max 40%     # of the GPU's capacity
  weight 200  # two shares of spare memory for every one of a batch model
  pool full { owner elastic }
}

# Batch models (a glob: any engine's instances whose model name matches).
model "batch-*" {
  priority 10
  min 2 GiB
  weight 100
}

# When memory runs short, take it back from batch jobs that have gone quiet:
# lowest priority first, longest idle first among equals.
rule "idle-reclaim" {
  when gpu.free < 8 GiB and model.idle > 5m
  order priority asc, idle desc
  shrink to min
  grace 30s    # a short burst does not count
  cooldown 2m  # leave an instance alone for a while after shrinking it
}
"""


def add_parser(sub: Subcommands) -> None:
    parser = sub.add_parser("init", help="write a commented starter policy", description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("file", nargs="?", default=DEFAULT_FILE, metavar="FILE",
                        help=f"where to write it (default: {DEFAULT_FILE}; - for standard output)")
    parser.add_argument("--force", action="store_true", help="replace FILE if it exists")
    add_format_option(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Exit 0 when written; 1 when FILE exists (without --force); 2 when it cannot be written."""
    if args.file == "-":
        sys.stdout.write(STARTER)
        return 0
    path = Path(args.file)
    try:
        exists = path_kind(path) != "missing"
    except OSError as exc:
        print(f"kvpolicy init: cannot write {path}: {reason(exc)}", file=sys.stderr)
        return 2
    if exists and not args.force:
        print(f"kvpolicy init: {path} exists; pass --force to replace it", file=sys.stderr)
        return 1
    try:
        path.write_text(STARTER, encoding="utf-8")
    except OSError as exc:
        print(f"kvpolicy init: cannot write {path}: {reason(exc)}", file=sys.stderr)
        return 2
    if args.format == "json":
        print(json.dumps({"schema": 1, "file": str(path), "written": True}))
    else:
        print(f"wrote {path}: edit it, then run: kvpolicy lint {path} && kvpolicy explain {path} --facts FACTS.json")
    return 0
