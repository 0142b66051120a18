"""The one aggregate algebra: what every merge computes, with no engine and no store.

- :mod:`.aggregates`: the aggregates (count, sum, mean, min, max, ...), their partial buffers
  and how two buffers combine;
- :mod:`.kernels`: exact numeric kernels (integer sums in 64 bits, decimals, means);
- :mod:`.expressions`: aggregates given as Spark Column expressions or ``(name, column)``;
- :mod:`.partials`: partial frames and ``merge_partials``.

The bottom room of :mod:`trilink_spark.merge`.
"""
