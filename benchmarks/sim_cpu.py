"""CPU time of simulate() on the bundled slices (benchmarks/sim_speed.py's cases), the least of
three runs in one process (time.process_time: steadier than wall time on a shared machine).

    .venv/bin/python benchmarks/sim_cpu.py LABEL [--smoke]

``--smoke``: each case once, on each slice's first 200 requests (the suite runs that, so the
script does not rot); LABEL may be left out.
"""

import argparse
import time
from pathlib import Path

from prefill_tuner.engines.sim import SimConfig, load_profile, simulate
from prefill_tuner.trace import ShapeOptions, load_trace

TRACES = Path(__file__).resolve().parent.parent / "examples" / "traces"
SMOKE_REQUESTS = 200


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("label", nargs="?", help="printed first on each line")
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    if args.label is None and not args.smoke:
        parser.error("the following arguments are required: label")
    label = args.label if args.label is not None else "smoke"
    runs, max_requests = (1, SMOKE_REQUESTS) if args.smoke else (3, None)
    p = load_profile("llama-3.1-8b-h100")
    for which in ("mooncake", "azure"):
        for mode in (True, False):
            if which == "mooncake":
                t = load_trace(
                    str(TRACES / "mooncake_conversation_head.jsonl"),
                    options=ShapeOptions(
                        rate_scale=0.1, max_model_len=32768, max_requests=max_requests
                    ),
                )
                c = SimConfig(
                    **{**p.engine_defaults, "max_model_len": 32768, "async_scheduling": mode}
                )
            else:
                t = load_trace(
                    str(TRACES / "azure_conv_2023_head.csv"),
                    options=ShapeOptions(max_requests=max_requests) if max_requests else None,
                )
                c = SimConfig(**{**p.engine_defaults, "async_scheduling": mode})
            cpu = []
            for _ in range(runs):
                a = time.process_time()
                r = simulate(t, c, p)
                cpu.append(time.process_time() - a)
            print(
                label,
                which,
                "async" if mode else "sync",
                f"cpu min {min(cpu):.3f}",
                r.steps,
                r.metrics.tpot_s["p99"],
            )


if __name__ == "__main__":
    main()
