"""What the KV cache's per-block dictionary work costs in a stored study's trials: the most a
representation keyed per trace block instead of per KV block (issue 30, item 2) could save.

    .venv/bin/python benchmarks/kv_block_work.py sqlite:///tune.db [--study NAME]
    .venv/bin/python benchmarks/kv_block_work.py [sqlite:///tune.db] --smoke

Simulates every trial again (as ``study_trials.py``) with a ``KVCache`` that counts the blocks
each per-block operation handles: entries made in the key map (a disjointness check and a
``dict.update``) and in the free-block map (a membership test against the blocks held twice,
and a ``dict.update``), each dropped once later (evicted, or taken out by a hit); block keys
made; blocks a prefix hit found. Then times each operation's whole life per block on this
machine (``timeit``, the least of five, 400-block batches in a dict of 40,000 entries, about
a trial's) and prints count × cost beside the trials' own CPU time.

``--smoke``: without a database, first makes a small study in a temporary folder (the main job,
``tune run --slo p99_tpot=50ms``, cut to 2 trials on the bundled sample's first 60 requests,
no report), then measures as above with ``timeit`` cut to the least of two 200-batch runs (the
suite runs that, so the script does not rot).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
import timeit
from collections import Counter
from pathlib import Path

from study_trials import simulated_trials, stored_study  # (this folder's: run as a script)

from prefill_tuner.engines.sim import scheduler, simulate
from prefill_tuner.engines.sim.kv_cache import KVCache
from prefill_tuner.engines.sim.request import SimRequest

COUNTS: Counter[str] = Counter()
BATCH = 400
SETUP = f"""
from collections import deque
from itertools import repeat
keys = list(range(10**9, 10**9 + {BATCH}))
blocks = list(range(5000, 5000 + {BATCH}))
d = dict.fromkeys(range(20000, 60000), 1)
run = object()
"""
COSTS = {
    # count: (one batch's statement, leaving the dict as it found it; what it stands for)
    "registered": (
        "d.keys().isdisjoint(keys); d.update(zip(keys, blocks));"
        "deque(map(d.__delitem__, keys), maxlen=0)",
        "key map entries, made and dropped",
    ),
    "freed": (
        "list(map(d.__contains__, blocks)); d.update(zip(blocks, repeat(run)));"
        "deque(map(d.__delitem__, blocks), maxlen=0)",
        "free-block map entries, made and dropped",
    ),
    "keys": (f"k = []; k.extend(range(10**9, 10**9 + {BATCH}))", "block keys made"),
    "hit": ("list(map(d.get, keys))", "blocks a prefix hit found"),
}
"""Each entry made is dropped once (evicted, or taken by a hit): its whole life is priced."""


class _Counting(KVCache):
    def _register(self, blocks: list[int], keys: list[int]) -> None:
        COUNTS["registered"] += len(blocks)
        super()._register(blocks, keys)

    def computed_blocks(self, request: SimRequest) -> list[int]:
        hit = super().computed_blocks(request)
        COUNTS["hit"] += len(hit)
        return hit

    def free(self, request: SimRequest, *, resumable: bool = False) -> None:
        # Its registered blocks (a preempted request's full ones: it registers them first)
        # enter the free-block map unless another request holds them too.
        registered = request.num_cached_blocks if resumable else request.registered_blocks
        held = request.blocks[:registered]
        COUNTS["freed"] += len(held) - sum(map(self._extra_refs.__contains__, held))
        COUNTS["keys"] += len(request.keys)
        super().free(request, resumable=resumable)


TIMING = (2000, 5)
"""``timeit``'s batches per run and runs (the least is taken)."""
SMOKE_TIMING = (200, 2)
SMOKE_JOB = ("--trials", "2", "--max-requests", "60", "--no-report")
"""``--smoke``'s study: the main job, cut."""


def _per_block_ns(statement: str, timing: tuple[int, int] = TIMING) -> float:
    number, repeat = timing
    spent = min(timeit.repeat(statement, SETUP, number=number, repeat=repeat))
    return spent / number / BATCH * 1e9


def smoke_study(folder: Path) -> str:
    """A small study made in ``folder`` (``--smoke`` without a database): its storage URL."""
    storage = f"sqlite:///{folder / 'tune.db'}"
    command = [sys.executable, "-m", "prefill_tuner", "run", "--slo", "p99_tpot=50ms"]
    done = subprocess.run(
        [*command, "--storage", storage, *SMOKE_JOB], cwd=folder, capture_output=True, text=True
    )
    if done.returncode not in (0, 4):  # 4: no trial met the SLO (a study all the same)
        raise SystemExit(f"making the smoke study failed:\n{done.stderr}")
    return storage


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("storage", nargs="?")
    parser.add_argument("--study", help="the study's name (default: the only one stored)")
    parser.add_argument(
        "--smoke", action="store_true", help="cheaper timing; no database: make a small study"
    )
    args = parser.parse_args()
    timing = SMOKE_TIMING if args.smoke else TIMING
    if args.storage is not None:
        measure(parser, args.storage, args.study, timing)
    elif not args.smoke:
        parser.error("the following arguments are required: storage")
    else:
        with tempfile.TemporaryDirectory(prefix="kv-block-work-") as folder:
            measure(parser, smoke_study(Path(folder)), args.study, timing)


def measure(
    parser: argparse.ArgumentParser, storage: str, study: str | None, timing: tuple[int, int]
) -> None:
    """Count and price the per-block work of the stored study's trials; print it."""
    store, record, trace = stored_study(parser, storage, study)
    runs = simulated_trials(store, record)
    spent = 0.0
    for config, profile in runs:  # uncounted first: the trials' own CPU time
        started = time.process_time()
        simulate(trace, config, profile)
        spent += time.process_time() - started
    # (the scheduler makes its cache by this name)
    scheduler.KVCache = _Counting  # type: ignore[misc]
    for config, profile in runs:
        simulate(trace, config, profile)
    total = 0.0
    print(f"{len(runs)} trials of study {record.name}: {spent:.2f} s of CPU")
    for name, (statement, words) in COSTS.items():
        cost = _per_block_ns(statement, timing)
        seconds = COUNTS[name] * cost / 1e9
        total += seconds
        print(f"  {words}: {COUNTS[name]:,} × {cost:.0f} ns = {seconds:.2f} s")
    print(f"  in all {total:.2f} s, {100 * total / spent:.1f}% of the trials' CPU")


if __name__ == "__main__":
    main()
