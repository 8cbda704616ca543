"""What resolving a trial's config costs, one vLLM process per question (before) against one
process for the whole study (after): issue 14, "cheaper real trials".

    .venv/bin/python benchmarks/resolve_cost.py [--repeat 3] [--python VLLM_PYTHON] [--smoke]

Resolves the tiny dummy-weight model's config with the CPU recipe's arguments and a varying
budget: ``--repeat`` times as a one-shot ``vllm_args.py resolve`` (vLLM imported afresh each
time, as every trial did), then through one :class:`VllmResolver` (the first question pays the
import; the rest are what each later trial pays). Prints medians, min and max.
``--smoke``: the one process only, ``--repeat 1`` (the probe, then three later resolves); the
one-shot resolves are left out, each being another import of vLLM. The one import left still
takes about 7 s on a small machine (nothing here runs without vLLM; no server is started).
Without vLLM's Python it says so in one line and exits 0. The suite runs that, so the script
does not rot.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from prefill_tuner.engines.real.cpu_recipe import CPU_SERVER_ARGS, write_tiny_model
from prefill_tuner.engines.real.resolver import VllmResolver, ask_vllm

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--python", default=str(ROOT / ".venv-vllm" / "bin" / "python"))
    parser.add_argument(
        "--smoke", action="store_true", help="the one process only, --repeat 1 (one vLLM import)"
    )
    args = parser.parse_args()
    if args.smoke:
        args.repeat = 1
        if not Path(args.python).exists():
            print(f"no vLLM Python at {args.python}: nothing to time (--smoke)")
            sys.exit(0)
    with tempfile.TemporaryDirectory() as folder:
        model = str(write_tiny_model(Path(folder) / "tiny"))
        one_shot = []
        for index in range(0 if args.smoke else args.repeat):
            started = time.perf_counter()
            budget = ["--max-num-batched-tokens", str(256 << index)]
            ask_vllm(args.python, "resolve", model, *CPU_SERVER_ARGS, *budget)
            one_shot.append(time.perf_counter() - started)
        with VllmResolver(args.python) as resolver:
            started = time.perf_counter()
            resolver.probe(model, CPU_SERVER_ARGS)
            first = time.perf_counter() - started
            later = []
            for index in range(args.repeat * 3):
                started = time.perf_counter()
                budget = ["--max-num-batched-tokens", str(256 << (index % 6))]
                resolver.resolve(model, [*CPU_SERVER_ARGS, *budget])
                later.append(time.perf_counter() - started)
    if args.smoke:
        print("one-shot resolve (before, every trial): left out (--smoke: a second vLLM import)")
    else:
        print(
            f"one-shot resolve (before, every trial): median {statistics.median(one_shot):.2f} s "
            f"(min {min(one_shot):.2f}, max {max(one_shot):.2f}, n={len(one_shot)})"
        )
    print(f"one process: first question (probe, once a study) {first:.2f} s")
    print(
        f"one process: each later resolve (after, every trial): median "
        f"{statistics.median(later) * 1000:.1f} ms (min {min(later) * 1000:.1f}, "
        f"max {max(later) * 1000:.1f}, n={len(later)})"
    )


if __name__ == "__main__":
    main()
