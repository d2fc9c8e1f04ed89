"""The quantile mechanisms, each releasing m quantiles of one dataset on a public grid.

The mechanisms, one module each: :mod:`~dpq_spark.core.quantiles.joint_exp` (JointExp, the
paper's mechanism), :mod:`~dpq_spark.core.quantiles.ind_exp` (IndExp, AppIndExp),
:mod:`~dpq_spark.core.quantiles.approx_quantiles`, :mod:`~dpq_spark.core.quantiles.agg_tree`
(AggTree and a flat histogram) and :mod:`~dpq_spark.core.quantiles.smooth` (Smooth, CSmooth).
Around them: :mod:`~dpq_spark.core.quantiles.bounds` (private bounds),
:mod:`~dpq_spark.core.quantiles.choose` (``auto``), :mod:`~dpq_spark.core.quantiles.mechanisms`
(the registry by name), :mod:`~dpq_spark.core.quantiles.batch` (many groups in one call) and
:mod:`~dpq_spark.core.quantiles.batch_private_bounds` (many groups, each with private bounds).
Building blocks: :mod:`~dpq_spark.core.quantiles.single_quantile` (the one-quantile exponential
mechanism), :mod:`~dpq_spark.core.quantiles.joint_exp_many` (JointExp's sampler batched),
:mod:`~dpq_spark.core.quantiles.joint_exp_envelope` (JointExp's draws outside its bands),
:mod:`~dpq_spark.core.quantiles.coarse_bands` (which cells JointExp can reach),
:mod:`~dpq_spark.core.quantiles.smooth_sensitivity`, and the private helpers ``_logscan``,
``_request`` and ``_sorted_data``.

The public functions are :mod:`dpq_spark.core`'s (``dpq_spark.core.joint_exp`` is the function,
``dpq_spark.core.quantiles.joint_exp`` its module).
"""
