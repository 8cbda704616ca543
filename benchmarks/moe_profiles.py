"""How well do the mixture-of-experts profiles read their tables (issue 44)?

    .venv/bin/python benchmarks/moe_profiles.py [--smoke]

**Leave-one-out along the tokens.** A profile reads a layer's fused experts from the shipped
tables (``moe.<dtype>``: AIConfigurator 0.12's measured vLLM kernels) at the model's shape and
split, linear in the step's tokens between measured counts. For every measured curve of every
GPU and expert dtype, each interior token count is removed in turn and read back from its
neighbours the way the profile reads it; the error ``read / measured − 1`` is summarised per GPU
and dtype (median and 90th percentile of its magnitude), over all counts and over the counts a
step of the default budgets reaches (up to 16,384 tokens).

**A step's experts against its whole.** For the bundled mixture-of-experts models, the share
of a decode step (64 requests at 2k context) and of an 8,192-token prefill that the experts
take: what the tables decide.

End to end against real GPU runs: ``benchmarks/gpu_truth.py --truth`` with the shared
``moe_minimax-m2.5_b200.csv`` (``RESULTS.md``).

``--smoke``: the H100 only, one model (the suite runs that, so the script does not rot).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from prefill_tuner.engines.sim.cost_model import StepShape
from prefill_tuner.engines.sim.kernels import build_kernel_profile, load_model_shape
from prefill_tuner.engines.sim.kernels.tables import gpu_tables, known_gpus
from prefill_tuner.errors import TunerError

MODELS = (
    ("Qwen/Qwen3-30B-A3B", "h100_sxm", 1, "bf16", False),
    ("Qwen/Qwen3-235B-A22B", "h200_sxm", 8, "fp8", False),
    ("mistralai/Mixtral-8x7B-v0.1", "h100_sxm", 2, "bf16", False),
    ("mistralai/Mixtral-8x22B-v0.1", "h200_sxm", 4, "fp8", False),
    ("MiniMaxAI/MiniMax-M2.5", "b200_sxm", 4, "fp8", False),
    ("MiniMaxAI/MiniMax-M2.5", "b200_sxm", 4, "fp8", True),
)


def leave_one_out(gpu: str) -> list[str]:
    """One line per expert dtype: the leave-one-out errors of its curves on ``gpu``."""
    tables = gpu_tables(gpu)
    lines = []
    for dtype in ("bf16", "fp8", "fp8_block", "mxfp4"):
        prefix = f"moe.{dtype}"
        if not tables.has(prefix):
            continue
        tokens = tables[f"{prefix}.tokens"].astype(np.float64)
        errors: list[float] = []
        reached: list[float] = []
        for row in tables[f"{prefix}.ms"]:
            measured = ~np.isnan(row)
            x, y = tokens[measured], row[measured]
            for i in range(1, x.size - 1):
                keep = np.arange(x.size) != i
                read = float(np.interp(x[i], x[keep], y[keep]))
                error = abs(read / y[i] - 1)
                errors.append(error)
                if x[i] <= 16384:
                    reached.append(error)
        if not errors:
            continue
        shapes = tables[f"{prefix}.keys"].shape[0]
        lines.append(
            f"| {gpu} | {dtype} | {shapes} | {len(errors)} | "
            f"{np.median(errors):.1%} / {np.percentile(errors, 90):.1%} | "
            f"{np.median(reached):.1%} / {np.percentile(reached, 90):.1%} |"
        )
    return lines


def shares(models: tuple[tuple[str, str, int, str, bool], ...]) -> list[str]:
    lines = []
    for model, gpu, tp, dtype, ep in models:
        try:
            p = build_kernel_profile(
                load_model_shape(model),
                gpu,
                tp,
                dtype,  # type: ignore[arg-type]
                expert_parallel=ep,
            )
        except TunerError as exc:
            lines.append(f"| {model} | {gpu} | {tp}{' EP' if ep else ''} | refused: {exc} | | |")
            continue
        assert p.experts is not None
        cells = []
        for shape, tokens in (
            (StepShape(decode_tokens=64, requests=64, decode_context_tokens=64 * 2048), 64),
            (StepShape(prefill_tokens=8192, requests=1, prefill_context_tokens=8192), 8192),
        ):
            total = p.step_seconds(shape)
            experts = p.layers * float(np.interp(tokens, p.experts.x, p.experts.ms)) / 1000
            cells.append(f"{total * 1000:.1f} ms, experts {experts / total:.0%}")
        lines.append(
            f"| {model} | {gpu} | {tp}{' EP' if ep else ''} | {p.expert_dtype} | "
            f"{cells[0]} | {cells[1]} |"
        )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    gpus = ["h100_sxm"] if args.smoke else known_gpus()
    print("Leave-one-out along the tokens (|read / measured − 1|, median / p90)\n")
    print("| GPU | experts | shapes × splits | points | all counts | up to 16,384 |")
    print("|---|---|---|---|---|---|")
    for gpu in gpus:
        for line in leave_one_out(gpu):
            print(line)
    print("\nA step's experts against its whole\n")
    print("| model | GPU | TP | experts | 64 decodes at 2k | an 8,192-token prefill |")
    print("|---|---|---|---|---|---|")
    for line in shares(MODELS[:1] if args.smoke else MODELS):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
