"""CPU time of simulate() on the bundled slices (benchmarks/sim_speed.py's cases), the least of
three runs in one process (time.process_time: steadier than wall time on a shared machine).

    .venv/bin/python benchmarks/sim_cpu.py LABEL
"""

import sys
import time

from prefill_tuner.engines.sim import SimConfig, load_profile, simulate
from prefill_tuner.trace import ShapeOptions, load_trace

p = load_profile("llama-3.1-8b-h100")
for which in ("mooncake", "azure"):
    for mode in (True, False):
        if which == "mooncake":
            t = load_trace(
                "examples/traces/mooncake_conversation_head.jsonl",
                options=ShapeOptions(rate_scale=0.1, max_model_len=32768),
            )
            c = SimConfig(**{**p.engine_defaults, "max_model_len": 32768, "async_scheduling": mode})
        else:
            t = load_trace("examples/traces/azure_conv_2023_head.csv")
            c = SimConfig(**{**p.engine_defaults, "async_scheduling": mode})
        cpu = []
        for _ in range(3):
            a = time.process_time()
            r = simulate(t, c, p)
            cpu.append(time.process_time() - a)
        print(
            sys.argv[1],
            which,
            "async" if mode else "sync",
            f"cpu min {min(cpu):.3f}",
            r.steps,
            r.metrics.tpot_s["p99"],
        )
