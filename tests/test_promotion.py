"""The nightly promotion rule: no promotion on noise alone, promotion on a real improvement,
feasibility first, and the first night."""

from __future__ import annotations

import numpy as np
import pytest

from prefill_tuner.nightly.promotion import Measurement, decide


def runs(*headrooms: float, feasible: bool | None = None) -> list[Measurement]:
    return [
        Measurement(feasible=h >= 0 if feasible is None else feasible, headroom=h, values={})
        for h in headrooms
    ]


def test_noise_alone_is_not_promoted() -> None:
    # Overlapping repeats: the challenger is better on median but not in every run.
    decision = decide(runs(0.30, 0.36, 0.33), runs(0.35, 0.45, 0.50))
    assert decision.action == "keep" and "within noise" in decision.reason


def test_a_real_improvement_is_promoted() -> None:
    decision = decide(runs(0.30, 0.31, 0.29), runs(0.45, 0.47, 0.44))
    assert decision.action == "promote" and "gain of +15.0 points" in decision.reason


def test_a_consistent_but_negligible_gain_is_not_worth_a_restart() -> None:
    decision = decide(runs(0.30, 0.30, 0.30), runs(0.32, 0.32, 0.32), min_gain=0.05)
    assert decision.action == "keep" and "under the 5 needed" in decision.reason
    assert decide(runs(0.30), runs(0.32), min_gain=0.01).action == "promote"


def test_meeting_the_slos_comes_first() -> None:
    # The incumbent missed once in three runs; the challenger met them every time.
    incumbent = runs(0.10, -0.05, 0.02)
    assert decide(incumbent, runs(0.01, 0.02, 0.015)).action == "promote"
    # A challenger that missed once is never promoted, however good its other runs.
    assert decide(runs(0.1, 0.1, 0.1), runs(0.9, 0.9, -0.01)).action == "keep"
    # Neither holds: the pipeline must hear that nothing meets the SLOs.
    assert decide(incumbent, runs(0.5, -0.2)).action == "none"
    assert decide(incumbent, None).action == "none"


def test_the_first_night_and_an_empty_search() -> None:
    assert decide(None, runs(0.2, 0.2, 0.2)).action == "promote"
    assert decide(None, runs(0.2, -0.1, 0.2)).action == "none"
    assert decide(None, None).action == "none"
    assert decide(runs(0.2, 0.2, 0.2), None).action == "keep"


@pytest.mark.parametrize(("min_gain", "at_most"), [(0.0, 0.07), (0.05, 0.01)])
def test_false_promotions_under_pure_noise_are_rare(min_gain: float, at_most: float) -> None:
    # Incumbent and challenger are the same configuration: 3 noisy runs each, many nights.
    rng = np.random.default_rng(7)
    nights = 4000
    promoted = sum(
        decide(runs(*rng.normal(0.3, 0.03, 3)), runs(*rng.normal(0.3, 0.03, 3)), min_gain).action
        == "promote"
        for _ in range(nights)
    )
    # All 3 challenger runs above all 3 incumbent runs: 1 chance in C(6, 3) = 20.
    assert promoted / nights <= at_most
    if min_gain == 0.0:
        assert promoted / nights == pytest.approx(1 / 20, abs=0.015)


def test_the_gain_is_the_median_not_the_worst_pair() -> None:
    """The README's rule: more headroom in every pair of runs, and the median headroom gained
    (not the worst pair's gain) at least --min-gain."""
    incumbent, challenger = [0.20, 0.21, 0.22], [0.23, 0.27, 0.30]
    decision = decide(runs(*incumbent), runs(*challenger), 0.05)
    assert decision.action == "promote"
    assert "median gain of +6.0 points (the worst pair of runs +1.0)" in decision.reason
    assert decide(runs(*incumbent), runs(*challenger), 0.07).action == "keep"


def test_a_gain_equal_to_min_gain_is_enough() -> None:
    assert decide(runs(0.20), runs(0.25), 0.05).action == "promote"  # 0.25 - 0.2 < 0.05
