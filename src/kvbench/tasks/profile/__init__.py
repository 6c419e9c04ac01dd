"""``task=profile``: time iterations of a real model on this device over a grid of shapes, fit
``engine.profiled.ProfiledCostModel`` to them and write it as a profile file
(docs/sim_to_real.md). Importing this package imports no torch; ``measure`` does."""
