"""The per-group step of ``dp_quantiles``: grid-cell counts in, one DP release out.

This runs inside ``applyInPandas`` on the executors (one call per group) and on the driver when
there is no grouping. It imports pandas and numpy only, never pyspark, so that it pickles by
reference and stays cheap to import in a Python worker.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from dpq_spark.core._random import resolve_rng
from dpq_spark.spark._mechanisms import get_mechanism

__all__ = ["CELL", "COUNT", "UNITS", "KEY_HASH", "ReleaseParams", "cell_values", "release_group"]

# Internal column names of the aggregated frame (the "__dpq_" prefix is reserved).
CELL = "__dpq_cell"
COUNT = "__dpq_count"
UNITS = "__dpq_units"
KEY_HASH = "__dpq_key_hash"

_UINT64 = 1 << 64


@dataclass(frozen=True)
class ReleaseParams:
    """Public, validated parameters of one group's release (pickled to the executors).

    ``epsilon`` is what the mechanism receives for one group, after the split for partition
    selection and the scaling for contribution bounding. ``threshold``/``noise_scale`` are set
    only when keys come from DP partition selection. ``base_seed`` is ``None`` in production
    (fresh OS entropy in every call) and an int only when the caller passed a Generator.
    """

    keys: tuple[str, ...]
    quantiles: tuple[float, ...]
    epsilon: float
    lower: float
    upper: float
    resolution: int
    neighboring: str
    mechanism: str
    base_seed: int | None = None
    threshold: float | None = None
    noise_scale: float | None = None


def cell_values(cells: np.ndarray, params: ReleaseParams) -> np.ndarray:
    """Midpoints of grid cells ``0 .. resolution - 1`` over ``[lower, upper]``."""
    width = (params.upper - params.lower) / params.resolution
    values = params.lower + (np.asarray(cells, dtype=np.float64) + 0.5) * width
    return np.clip(values, params.lower, params.upper)


def _group_rng(params: ReleaseParams, key_hash) -> np.random.Generator:
    if params.base_seed is None:
        return resolve_rng(None)
    return np.random.default_rng([params.base_seed, int(key_hash) % _UINT64])


def release_group(pdf: pd.DataFrame, params: ReleaseParams) -> pd.DataFrame:
    """Release the quantiles of one group from its cell counts.

    Parameters
    ----------
    pdf : pandas.DataFrame
        The rows of one group: key columns, ``CELL`` (int grid cell, or -1 for the placeholder
        row that gives a public key with no data its answer), ``COUNT`` (rows in the cell),
        optionally ``UNITS`` (privacy units first seen in the cell) and ``KEY_HASH``.
    params : ReleaseParams
        Public parameters.

    Returns
    -------
    pandas.DataFrame
        Key columns, ``quantile`` and ``value``: one row per quantile, or no rows when partition
        selection drops the group.

    Privacy
    -------
    ``params.epsilon``-DP for the group's cell counts under ``params.neighboring`` (the
    mechanism's guarantee); with partition selection, also the Laplace threshold step.
    """
    key_hash = pdf[KEY_HASH].iloc[0] if KEY_HASH in pdf.columns and len(pdf) else 0
    rng = _group_rng(params, key_hash)
    real = pdf[pdf[COUNT] > 0]
    cells = real[CELL].to_numpy(dtype=np.int64)
    counts = real[COUNT].to_numpy(dtype=np.int64)
    order = np.argsort(cells, kind="stable")
    cells, counts = cells[order], counts[order]

    key_values = {k: pdf[k].iloc[:1] for k in params.keys}
    m = len(params.quantiles)
    if params.threshold is not None:
        units = float(real[UNITS].sum()) if UNITS in real.columns else float(counts.sum())
        if units + rng.laplace(0.0, params.noise_scale) < params.threshold:
            return _frame(key_values, params, np.empty(0), 0)

    mechanism = get_mechanism(params.mechanism)
    out = mechanism(
        cell_values(cells, params),
        np.asarray(params.quantiles, dtype=np.float64),
        epsilon=params.epsilon,
        lower=params.lower,
        upper=params.upper,
        neighboring=params.neighboring,
        counts=counts,
        rng=rng,
    )
    return _frame(key_values, params, np.asarray(out, dtype=np.float64), m)


def _frame(key_values: dict, params: ReleaseParams, values: np.ndarray, m: int) -> pd.DataFrame:
    data = {k: v.repeat(m).reset_index(drop=True) for k, v in key_values.items()}
    data["quantile"] = np.asarray(params.quantiles[:m], dtype=np.float64)
    data["value"] = values
    return pd.DataFrame(data)
