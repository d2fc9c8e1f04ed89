"""The shared loop of the mechanism-choice benchmarks (``choosing_few_rows.py``,
``choosing_small_m.py``): measure every job in a process pool, print one line of error ratios
per job, keep each mechanism's worst ratio per case, and write the results file."""

from __future__ import annotations

import argparse
import os
import time
from multiprocessing import Pool
from pathlib import Path
from typing import Callable

import numpy as np


def parser(doc: str, out: Path, quick: str) -> argparse.ArgumentParser:
    """The options every choice benchmark takes: ``--quick``, ``--processes``, ``--out`` and
    ``--summary-from`` (the summary again from a results file, no runs)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help=quick)
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--out", type=Path, default=out)
    ap.add_argument("--summary-from", type=Path, default=None,
                    help="print the summary from a results file's ratios (no runs)")
    return ap


def ratios(mean: np.ndarray) -> np.ndarray:
    """Each mechanism's mean error over the best one's (1 where both are exactly 0)."""
    best = mean.min()
    if best > 0:
        return mean / best
    return np.where(mean == 0, 1.0, np.inf)


def measure(run: Callable, jobs: list, case_of: Callable, label_of: Callable, *, processes: int,
            width: int) -> tuple[list[str], dict]:
    """``run(job) -> (job, mean errors)`` over ``jobs``; returns the printed lines and, per
    ``case_of(job)``, the worst ratio of each mechanism over the case's jobs."""
    lines, worst = [], {}
    with Pool(processes) as pool:
        for job, mean in pool.imap(run, jobs):
            r = ratios(mean)
            case = case_of(job)
            worst[case] = np.maximum(worst.get(case, r), r)
            line = label_of(job) + " " + " ".join(f"{v:{width}.2f}" for v in r)
            lines.append(line)
            print(line, flush=True)
    return lines, worst


def finish(lines: list[str], summary: list[str], started: float, out: Path | None) -> None:
    """Print the summary, stamp the date, run time and load, and write ``out`` (None: print only)."""
    print("\n".join(summary), flush=True)
    lines = lines + summary + [f"# {time.strftime('%Y-%m-%d')}, {time.time() - started:.0f} s, load "
                               f"average at end {os.getloadavg()[0]:.2f}"]
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("\n".join(lines) + "\n")
        print(f"written to {out}")
