"""How close is the simulator to real vLLM runs on GPUs (issue 42)?

    .venv/bin/python benchmarks/gpu_truth.py [--truth FILE] [--per-slot N] [--worst K] [--smoke]
        [--path TERM=VALUE,...] [--vary-lengths FRACTION] [--set FIELD=EXPRESSION,...]
        [--kv-cache-dtype auto|fp8] [--gpu-memory-utilization SHARE]

Each row of ``shared/gpu-truth/dense_qwen3-32b_h100.csv`` beside the checkout (NVIDIA
AIConfigurator 0.12's accuracy sample: one vLLM server benchmarked by a closed-loop load
generator at ``batch_size`` requests in flight, every request ``isl`` prompt and ``osl`` output
tokens; mean TTFT and mean TPOT measured) is replayed on the simulator as ``tune simulate
--max-concurrency BATCH`` would: a profile built from the shipped kernel tables for the row's
model (its ``config.json`` in ``models/``), GPU, TP and dtype, the defaults of the row's vLLM
release otherwise (``release_defaults``: the runs' vLLM 0.12 scheduled synchronously, as vLLM
did before 0.14.0; before 0.28.0 a B200 had an 8,192-token budget, not 16,384; before 0.20 vLLM
took 0.9 of the GPU's memory, not 0.92: ``release_memory_share``), ``--per-slot``
requests per slot (10: the load generator's count is not recorded), all of them ready at the
start, as a load generator sends them. Nothing is fitted to the rows.

Prints each row's simulated and measured means, the error ``simulated / measured − 1``, how
many requests the simulation prefilled together per prefill step (a lockstep wave of the
whole concurrency shows as its budget-bound group), and the simulated mean TTFT of the first
wave (the ``batch`` requests sent at the start) and of the rest, then the median and 90th
percentile of ``|error|`` for TTFT and TPOT, overall, by TP and by prompt length, for the
rows ``tune simulate`` says ran in lockstep waves and for the others (``engines/sim/waves.py``:
its ``TTFT caveat``), and the worst rows.
``--path`` sets request-path terms of the profiles (``request_interval_ms=5,
response_output_us=100``; ``docs/simulator.md``, "A request's life"): an experiment, to see
what each moves; the shipped profiles have none (0 until calibrated on a server).
``--vary-lengths 0.2`` draws each request's prompt and output lengths uniformly within ±20% of
the row's (seeded): waves of identical requests no longer finish together, which shows what
the simulator gives where they are broken entirely.
``--set`` replays every row with engine settings the runs may have had but did not record, each
an integer expression in the row's ``isl``, ``osl`` and ``batch``:
``--set max_num_batched_tokens=batch+isl+1500,max_num_seqs=batch`` is what NVIDIA
AIConfigurator's generator writes for an aggregated vLLM deployment (its ``rule_plugin/
vllm.rule``: ``max_num_tokens = max_batch_size + isl + 1500``): an experiment, to see how much
the unrecorded settings decide. ``--gpu-memory-utilization`` sizes the KV pool as a run's
``--gpu-memory-utilization`` did (InferenceX's MiniMax-M2.5 runs give 0.95).
``--smoke``: three rows, fewer requests (the suite runs that, so the script does not rot).
"""

from __future__ import annotations

import argparse
import ast
import csv
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from prefill_tuner.engines.sim import SimConfig
from prefill_tuner.engines.sim.config import (
    release_defaults,
    release_memory_share,
    resolve_config,
)
from prefill_tuner.engines.sim.hardware import ProfileSpec
from prefill_tuner.engines.sim.loop import simulate
from prefill_tuner.engines.sim.profile_base import PATH_TERMS
from prefill_tuner.engines.sim.waves import lockstep
from prefill_tuner.errors import TunerError
from prefill_tuner.trace.model import Request, Trace

ROOT = Path(__file__).resolve().parents[1]
TRUTH = ROOT.parent / "shared" / "gpu-truth" / "dense_qwen3-32b_h100.csv"


@dataclass(frozen=True)
class Row:
    """One real run."""

    model: str
    gpu: str
    dtype: str
    tp: int
    vllm: str
    """The vLLM release the run used."""
    isl: int
    osl: int
    batch: int
    ttft_ms: float
    tpot_ms: float
    expert_parallel: bool = False
    """A mixture-of-experts run's experts spread whole over the GPUs (``moe_ep_size`` > 1)."""
    attention_dp: int = 1
    """Data-parallel attention ranks (not modelled: such rows are left out, and counted)."""

    def label(self) -> str:
        ep = "ep " if self.expert_parallel else ""
        return f"tp{self.tp} {ep}{self.dtype} {self.isl}/{self.osl} c={self.batch}"


@dataclass(frozen=True)
class Compared:
    row: Row
    ttft_ms: float
    tpot_ms: float
    together: float
    """Requests prefilling per prefill step, on average over the simulated steps that did."""
    first_wave_ms: float = math.nan
    """Mean TTFT of the first ``batch`` requests (all sent at the start)."""
    later_ms: float = math.nan
    """Mean TTFT of the rest (sent as earlier ones finished)."""
    lockstep: bool = False
    """Whether ``tune simulate`` says the replay ran in lockstep waves (``waves.lockstep``)."""

    @property
    def ttft_error(self) -> float:
        return self.ttft_ms / self.row.ttft_ms - 1

    @property
    def tpot_error(self) -> float:
        return self.tpot_ms / self.row.tpot_ms - 1


def read_rows(path: Path) -> list[Row]:
    with path.open(newline="") as stream:
        return [
            Row(
                model=line["model_path"],
                gpu=line["system"],
                dtype=line["precision"],
                tp=int(line["tp_size"]),
                vllm=line["backend_version"],
                isl=int(line["isl"]),
                osl=int(line["osl"]),
                batch=int(line["batch_size"]),
                ttft_ms=float(line["silicon_ttft_ms"]),
                tpot_ms=float(line["silicon_tpot_ms"]),
                expert_parallel=int(line.get("moe_ep_size") or 1) > 1,
                attention_dp=int(line.get("attention_dp_size") or 1),
            )
            for line in csv.DictReader(stream)
        ]


SETTING_NAMES = ("isl", "osl", "batch")
"""What a ``--set`` expression may name: the row's prompt and output lengths, its concurrency."""


def setting_expression(text: str) -> ast.Expression:
    """``text`` parsed as an integer expression over :data:`SETTING_NAMES` (``+ - * //``,
    integers, parentheses); a ``ValueError`` naming what else it holds."""
    tree = ast.parse(text.strip(), mode="eval")
    allowed = (ast.Expression, ast.BinOp, ast.Add, ast.Sub, ast.Mult, ast.FloorDiv, ast.Load)
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in SETTING_NAMES:
            continue
        if isinstance(node, ast.Constant) and type(node.value) is int:
            continue
        if not isinstance(node, allowed):
            raise ValueError(f"{text!r}: only integers, {', '.join(SETTING_NAMES)}, + - * //")
    return tree


def row_settings(row: Row, expressions: dict[str, ast.Expression]) -> dict[str, int]:
    """The ``--set`` settings for ``row``."""
    names = {"isl": row.isl, "osl": row.osl, "batch": row.batch}
    return {
        field: int(eval(compile(tree, "--set", "eval"), {"__builtins__": {}}, names))
        for field, tree in expressions.items()
    }


def replay(
    row: Row,
    models: Path,
    per_slot: int,
    path: dict[str, float] | None = None,
    vary: float = 0.0,
    kv_cache_dtype: str = "auto",
    settings: dict[str, int] | None = None,
    memory_share: float | None = None,
) -> Compared:
    """The row's workload on the simulator: its means, in milliseconds. ``path``: request-path
    terms set on the profile, to see what they move; ``settings``: engine settings over the
    release's defaults."""
    config_file = models / f"{row.model.replace('/', '--')}.json"
    spec = ProfileSpec(
        model_config=str(config_file),
        gpu=row.gpu,
        tp=row.tp,
        dtype=row.dtype,  # type: ignore[arg-type]
        expert_parallel=row.expert_parallel,
        kv_cache_dtype=kv_cache_dtype,  # type: ignore[arg-type]
        gpu_memory_utilization=release_memory_share(row.vllm)
        if memory_share is None
        else memory_share,
    )
    profile = spec.step_model(row.model, math.ceil((row.isl + row.osl) * (1 + vary)))
    if path:
        profile = profile.model_copy(update=path)
    config = resolve_config(profile, {**release_defaults(profile, row.vllm), **(settings or {})})
    count = row.batch * per_slot
    rng = np.random.default_rng(0)

    def length(tokens: int) -> int:
        return int(rng.integers(int(tokens * (1 - vary)), int(tokens * (1 + vary)) + 1))

    requests = tuple(
        Request(str(i), 0.0, prompt_tokens=length(row.isl), output_tokens=length(row.osl))
        for i in range(count)
    )
    together: list[int] = []
    result = simulate(
        Trace(requests),
        config,
        profile,
        max_concurrency=row.batch,
        on_step=lambda step: together.append(len(step.scheduled) - step.decode_tokens),
    )
    metrics, prefilling = result.metrics, [count for count in together if count]
    waves = lockstep(Trace(requests), row.batch, result.admitted_together) is not None
    ttft = {int(r.id): r.token_times_s[0] - r.sent_s for r in result.records if r.completed}
    first = [t for i, t in ttft.items() if i < row.batch]
    later = [t for i, t in ttft.items() if i >= row.batch]
    return Compared(
        row,
        1000 * metrics.ttft_s["mean"],
        1000 * metrics.tpot_s["mean"],
        float(np.mean(prefilling)) if prefilling else 0.0,
        1000 * float(np.mean(first)) if first else math.nan,
        1000 * float(np.mean(later)) if later else math.nan,
        waves,
    )


def _stats(errors: list[float]) -> str:
    absolute = np.abs(errors)
    return f"median {np.median(absolute):.1%}, p90 {np.percentile(absolute, 90):.1%}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--truth", type=Path, default=TRUTH)
    parser.add_argument("--per-slot", type=int, default=10)
    parser.add_argument("--worst", type=int, default=8)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument(
        "--path",
        metavar="TERM=VALUE,...",
        help="set request-path terms of the profiles (an experiment: what they move)",
    )
    parser.add_argument("--vary-lengths", type=float, default=0.0, metavar="FRACTION")
    parser.add_argument("--kv-cache-dtype", choices=("auto", "fp8"), default="auto")
    parser.add_argument(
        "--gpu-memory-utilization",
        type=float,
        metavar="SHARE",
        help="the share of GPU memory the runs gave vLLM (the KV pool; default: their release's)",
    )
    parser.add_argument(
        "--set",
        metavar="FIELD=EXPRESSION,...",
        help="engine settings for every row, in its isl, osl and batch (an experiment)",
    )
    args = parser.parse_args()
    if not 0 <= args.vary_lengths < 1:
        parser.error("--vary-lengths: a fraction from 0 to under 1")
    if not args.truth.is_file():
        parser.error(f"{args.truth}: no such file (the shared GPU runs sit beside the repository)")
    rows = read_rows(args.truth)
    left_out = [row for row in rows if row.attention_dp > 1]
    rows = [row for row in rows if row.attention_dp == 1]
    if left_out:
        print(f"left out: {len(left_out)} runs with data-parallel attention (not modelled)\n")
    if args.smoke:
        rows, args.per_slot = rows[:3], 2
    path = None
    if args.path:
        terms = dict(part.split("=", 1) for part in args.path.split(","))
        unknown = set(terms) - set(PATH_TERMS)
        if unknown:
            parser.error(f"--path: {', '.join(sorted(unknown))}: not one of {PATH_TERMS}")
        path = {term: float(value) for term, value in terms.items()}
    expressions: dict[str, ast.Expression] = {}
    for part in (args.set or "").split(","):
        if not part.strip():
            continue
        field, _, text = part.partition("=")
        field = field.strip()
        if field not in SimConfig.model_fields:
            parser.error(f"--set {field!r}: not an engine setting (one of SimConfig's fields)")
        try:
            expressions[field] = setting_expression(text)
        except (SyntaxError, ValueError) as exc:
            parser.error(f"--set {field}: {exc}")
    models = args.truth.parent / "models"
    compared = []
    for row in rows:
        try:
            settings = row_settings(row, expressions)
            compared.append(
                replay(
                    row,
                    models,
                    args.per_slot,
                    path,
                    args.vary_lengths,
                    args.kv_cache_dtype,
                    settings,
                    args.gpu_memory_utilization,
                )
            )
        except (TunerError, ArithmeticError) as exc:
            parser.error(f"{row.label()}: {exc}")
    print(
        "| run | TTFT sim / real ms | error | TPOT sim / real ms | error | together "
        "| TTFT first wave / later ms |"
    )
    print("|---|---|---|---|---|---|---|")
    for c in compared:
        print(
            f"| {c.row.label()} | {c.ttft_ms:.1f} / {c.row.ttft_ms:.1f} | {c.ttft_error:+.0%} "
            f"| {c.tpot_ms:.2f} / {c.row.tpot_ms:.2f} | {c.tpot_error:+.0%} | {c.together:.1f} "
            f"| {c.first_wave_ms:.0f} / {c.later_ms:.0f} |"
        )
    print()
    print(f"TTFT |error|: {_stats([c.ttft_error for c in compared])} ({len(compared)} runs)")
    print(f"TPOT |error|: {_stats([c.tpot_error for c in compared])}")
    for tp in sorted({c.row.tp for c in compared}):
        part = [c for c in compared if c.row.tp == tp]
        print(
            f"  tp{tp} ({len(part)} runs): TTFT {_stats([c.ttft_error for c in part])}; "
            f"TPOT {_stats([c.tpot_error for c in part])}"
        )
    for dtype in sorted({c.row.dtype for c in compared}):
        part = [c for c in compared if c.row.dtype == dtype]
        print(
            f"  {dtype} ({len(part)} runs): TTFT {_stats([c.ttft_error for c in part])}; "
            f"TPOT {_stats([c.tpot_error for c in part])}"
        )
    for isl in sorted({c.row.isl for c in compared}):
        part = [c for c in compared if c.row.isl == isl]
        signed = np.median([c.ttft_error for c in part])
        print(
            f"  {isl}-token prompts ({len(part)} runs): TTFT {_stats([c.ttft_error for c in part])}"
            f" (signed median {signed:+.0%}); TPOT {_stats([c.tpot_error for c in part])}"
        )
    for flagged, name in ((True, "said to run in lockstep waves"), (False, "the others")):
        part = [c.ttft_error for c in compared if c.lockstep == flagged]
        if part:
            print(
                f"  {name} ({len(part)} runs): TTFT signed median {np.median(part):+.0%}, "
                f"from {min(part):+.0%} to {max(part):+.0%}"
            )
    worst = sorted(compared, key=lambda c: -abs(c.ttft_error))[: args.worst]
    print("worst TTFT: " + "; ".join(f"{c.row.label()} {c.ttft_error:+.0%}" for c in worst))
    return 0


if __name__ == "__main__":
    sys.exit(main())
