"""A chi-square test of split counts against the multinomial with equal cells (shared by the
tests of the exact samplers and of the sub-cell spread)."""

from __future__ import annotations

import math
from itertools import combinations_with_replacement

import numpy as np
from scipy import stats


def composition_pvalue(rows_of_draws, count, parts):
    """Chi-square p-value of observed splits (one row per draw: the ``count`` rows' counts in
    each of ``parts`` cells) against the multinomial of independent rows over equal cells."""
    outcomes = {}
    for combo in combinations_with_replacement(range(parts), count):
        key = tuple(np.bincount(combo, minlength=parts))
        outcomes[key] = math.factorial(count) / math.prod(math.factorial(a) for a in key) / parts**count
    keys = list(outcomes)
    seen = np.zeros(len(keys))
    for row in rows_of_draws:
        seen[keys.index(tuple(row))] += 1
    expected = np.array([outcomes[k] for k in keys]) * len(rows_of_draws)
    return stats.chisquare(seen, expected).pvalue
