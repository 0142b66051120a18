"""Local Merge: the operator, its flush bounds and the engines that run it.

- :mod:`.bounds`: the merge modes and where each flush ends (groups, quantity, periodic,
  punctuation);
- :mod:`.plan`: a merge's validated plan;
- :mod:`.engine`: the engine ladder of the merges (the one ladder of ``_internal.engines``);
- :mod:`.pandas_engine`, :mod:`.arrow_engine`, :mod:`.spark_engine`: the engines;
- :mod:`.local`: ``local_merge`` and ``explain_local_merge``;
- :mod:`.stream`: ``local_merge_foreach_batch``.

Above :mod:`..algebra`, below :mod:`..stores`.
"""
