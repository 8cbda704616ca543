"""What the KV cache's per-block dictionary work costs in a stored study's trials: the most a
representation keyed per trace block instead of per KV block (issue 30, item 2) could save.

    .venv/bin/python benchmarks/kv_block_work.py sqlite:///tune.db [--study NAME]

Simulates every trial again (as ``study_trials.py``) with a ``KVCache`` that counts the blocks
each per-block operation handles: entries made in the key map (a disjointness check and a
``dict.update``) and in the free-block map (a membership test against the blocks held twice,
and a ``dict.update``), each dropped once later (evicted, or taken out by a hit); block keys
made; blocks a prefix hit found. Then times each operation's whole life per block on this
machine (``timeit``, the least of five, 400-block batches in a dict of 40,000 entries, about
a trial's) and prints count × cost beside the trials' own CPU time.
"""

from __future__ import annotations

import argparse
import time
import timeit
from collections import Counter

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


def _per_block_ns(statement: str) -> float:
    spent = min(timeit.repeat(statement, SETUP, number=2000, repeat=5))
    return spent / 2000 / BATCH * 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("storage")
    parser.add_argument("--study", help="the study's name (default: the only one stored)")
    args = parser.parse_args()
    store, record, trace = stored_study(parser, args.storage, args.study)
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
        cost = _per_block_ns(statement)
        seconds = COUNTS[name] * cost / 1e9
        total += seconds
        print(f"  {words}: {COUNTS[name]:,} × {cost:.0f} ns = {seconds:.2f} s")
    print(f"  in all {total:.2f} s, {100 * total / spent:.1f}% of the trials' CPU")


if __name__ == "__main__":
    main()
