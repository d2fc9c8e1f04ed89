"""Privacy accounting: neighbouring relations, sensitivities and composition.

- :mod:`~dpq_spark.core.accounting.neighboring`: the neighbouring relations and the sensitivity
  of each quantile utility.
- :mod:`~dpq_spark.core.accounting.composition`: the tight composition bound of exponential
  mechanisms behind AppIndExp.
"""
