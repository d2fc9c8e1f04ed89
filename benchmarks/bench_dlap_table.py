"""Build time of the exact discrete Laplace table, side by side: the interval-arithmetic build
(what DLapTable uses) against the decimal rule alone (one decimal ``exp`` per threshold).

    .venv/bin/python benchmarks/bench_dlap_table.py          # decimal rule up to scale 4,000
    .venv/bin/python benchmarks/bench_dlap_table.py --full   # ... and at 22,500 too (~1 min)

The scales are those of AggTree's noise at small epsilon (height 4: scale 4 / epsilon, 8 / epsilon
under swap) and of auto's noisy count (1 / (0.05 epsilon)). Both builds give the same thresholds
(checked here on every scale timed for both).
"""

from __future__ import annotations

import argparse
import os
import time
from fractions import Fraction

from dpq_spark.core.randomness.dlap_table import _TAIL_FLOOR, _U_BITS, _floor_scaled, _thresholds


def decimal_rule(scale: Fraction) -> list[int]:
    out, k = [], 1
    while True:
        t = _floor_scaled(scale, k, _U_BITS)
        if t < _TAIL_FLOOR or (out and t >= out[-1]):
            return out
        out.append(t)
        k += 1


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="also time the decimal rule at 22,500")
    args = parser.parse_args(argv)
    print(f"load average {os.getloadavg()[0]:.2f}")
    print(f"{'scale':>8} {'thresholds':>11} {'interval s':>11} {'decimal s':>10} {'ratio':>7}")
    for scale in (100, 800, 4000, 22500):
        t0 = time.perf_counter()
        fast = _thresholds(Fraction(scale))
        t_fast = time.perf_counter() - t0
        if scale <= 4000 or args.full:
            t0 = time.perf_counter()
            slow = decimal_rule(Fraction(scale))
            t_slow = time.perf_counter() - t0
            assert slow == fast, scale
            print(f"{scale:>8} {len(fast):>11,} {t_fast:>11.3f} {t_slow:>10.2f} {t_slow / t_fast:>6.0f}x")
        else:
            print(f"{scale:>8} {len(fast):>11,} {t_fast:>11.3f} {'-':>10} {'-':>7}")


if __name__ == "__main__":
    main()
