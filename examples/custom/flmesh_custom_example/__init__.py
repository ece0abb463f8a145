"""A user's package for flmesh: a 1-D CNN (:mod:`.model`), synthetic waveforms
(:mod:`.data`), a learner with clipping and macro-F1 (:mod:`.learner`) and a robust
aggregation rule registered as ``rfa`` (:mod:`.algorithm`)."""
