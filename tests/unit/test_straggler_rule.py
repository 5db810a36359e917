"""The slow-rank rule (workload.training.stragglers): a rank is slow when its own work per
step is more than 20 % above the median of the other ranks. The e2e proof with two real
ranks: tests/e2e/test_stragglers.py."""

from __future__ import annotations

import pytest

from workload.training.stragglers import slow_ranks


@pytest.mark.parametrize("busy, slow", [
    # Two ranks: 25 % slower than the other is slow (against the mean of both it is 11 %).
    ([0.010, 0.0125], [False, True]),
    ([0.010, 0.0115], [False, False]),
    # Many ranks: one slow rank, and the fast ones are not slow against the others.
    ([0.010, 0.010, 0.013, 0.010], [False, False, True, False]),
    ([0.010, 0.011, 0.010, 0.0105], [False, False, False, False]),
    # Nothing measured yet: nobody is judged.
    ([0.0, 0.0], [False, False]),
])
def test_a_rank_is_slow_past_20_percent_above_the_others_median(busy, slow):
    assert slow_ranks(busy) == slow
