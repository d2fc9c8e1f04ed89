"""Randomness and exact noise: the one random source, exact integer samplers, the discrete
Laplace table and the public output grid.

Every released number of a float-safe mechanism is a fixed function of integers drawn here from
uniform random bits (:mod:`~dpq_spark.core.randomness.source`), never of a float uniform.

- :mod:`~dpq_spark.core.randomness.source`: ``resolve_rng``, the OS CSPRNG or a test seed.
- :mod:`~dpq_spark.core.randomness.samplers`: exact Bernoulli, geometric and discrete Laplace.
- :mod:`~dpq_spark.core.randomness.dlap_table`: many discrete Laplace draws of one scale.
- :mod:`~dpq_spark.core.randomness.grid`: the public grid releases land on, and draws on it.
"""
