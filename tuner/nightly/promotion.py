"""When a nightly retune replaces the serving configuration: the promotion rule.

Each configuration is measured ``repeats`` times on the night's trace. A measurement is
*feasible* when it meets every SLO and the error budget; its *headroom* is its smallest slack
(0.2 = 20% under the tightest limit), the quantity the study's recommendation maximises.
A configuration *holds* when every repeat is feasible. Then:

1. No incumbent yet (first night), or the incumbent cannot run on this engine version:
   promote the challenger if it holds.
2. The incumbent no longer holds and the challenger does: promote.
3. Both hold: promote only when every repeat of the challenger has more headroom than every
   repeat of the incumbent (with 3 repeats each, the chance of that under noise alone is
   1 in 20: a one-sided rank test at p = 0.05) *and* the typical gain, the challenger's median
   headroom minus the incumbent's, is at least ``min_gain`` (default 0.05: five percentage
   points of the tightest limit), so that a real but negligible gain does not restart servers.

   Why not "every run beats every run by ``min_gain``": the rank test already settles that the
   gain is real; asking the worst pair to clear ``min_gain`` as well would demand the gain
   plus the whole spread of the noise, so a real 6-point gain measured with 4 points of noise
   would never be promoted. Why not the median of the pairwise gains (the Hodges-Lehmann
   estimate): under pure noise (3 + 3 runs, 3 points of spread, 4,000 simulated nights,
   tests/test_promotion.py) it promotes 1.4% of nights at 5 points against 1% or less for the
   difference of medians. The worst pair's gain is reported beside the median.
4. Otherwise keep the incumbent; when neither holds, say that nothing meets the SLOs.

A deterministic engine (the simulator) gives identical repeats, so it is measured once and
the rule reduces to rules 1-2 and the ``min_gain`` threshold.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from prefill_tuner import defaults

GAIN_TOLERANCE = 1e-9
"""Headroom is computed in floating point (0.25 − 0.20 is 0.04999…): a gain this close to
``min_gain`` meets it."""


@dataclass(frozen=True)
class Measurement:
    """One run of one configuration on the night's trace."""

    feasible: bool
    headroom: float
    """Smallest slack over the SLOs (negative when one is violated)."""
    values: dict[str, float]
    """The SLO'd statistics measured (``p99_ttft`` → seconds), for the report."""
    failure: str | None = None


@dataclass(frozen=True)
class Decision:
    action: Literal["promote", "keep", "none", "rejected"]
    """``none``: no configuration meets the SLOs (the incumbent, if any, stays deployed);
    ``rejected``: the challenger won, but ``tune verify`` found chunking changes its outputs
    (the incumbent stays)."""
    reason: str


def holds(runs: Sequence[Measurement]) -> bool:
    """Every repeat met every SLO."""
    return bool(runs) and all(run.feasible for run in runs)


def decide(
    incumbent: Sequence[Measurement] | None,
    challenger: Sequence[Measurement] | None,
    min_gain: float = defaults.MIN_GAIN,
) -> Decision:
    """Apply the rule above. ``None``: no such configuration (no incumbent yet, or the search
    found no challenger other than the incumbent)."""
    challenger_holds = challenger is not None and holds(challenger)
    if incumbent is None:
        if challenger_holds:
            return Decision("promote", "no incumbent yet; the challenger meets the SLOs")
        return Decision("none", "no configuration met the SLOs")
    incumbent_holds = holds(incumbent)
    if not incumbent_holds:
        failed = sum(not run.feasible for run in incumbent)
        if challenger_holds:
            return Decision(
                "promote",
                f"the incumbent missed the SLOs in {failed} of {len(incumbent)} runs; "
                "the challenger met them in every run",
            )
        return Decision("none", "neither the incumbent nor any challenger met the SLOs")
    if challenger is None:
        return Decision("keep", "the search found nothing better than the incumbent")
    if not challenger_holds:
        return Decision("keep", "the challenger missed the SLOs in a re-measurement")
    worst_challenger = min(run.headroom for run in challenger)
    best_incumbent = max(run.headroom for run in incumbent)
    gains = [c.headroom - i.headroom for c in challenger for i in incumbent]
    gain = statistics.median(r.headroom for r in challenger) - statistics.median(
        r.headroom for r in incumbent
    )
    if worst_challenger <= best_incumbent:
        return Decision(
            "keep",
            f"the challenger's headroom ({_range(challenger)}) does not clear the incumbent's "
            f"({_range(incumbent)}) in every run: within noise",
        )
    if gain < min_gain - GAIN_TOLERANCE:
        return Decision(
            "keep",
            f"the challenger gains {gain * 100:+.1f} points of headroom, under the "
            f"{min_gain * 100:g} needed",
        )
    return Decision(
        "promote",
        f"the challenger has more headroom in every run ({_range(challenger)} against "
        f"{_range(incumbent)}), a median gain of {gain * 100:+.1f} points (the worst pair of "
        f"runs {min(gains) * 100:+.1f})",
    )


def _range(runs: Sequence[Measurement]) -> str:
    values = [run.headroom for run in runs]
    low, high = min(values), max(values)
    return f"{low:.1%}" if low == high else f"{low:.1%}..{high:.1%}"
