"""``experiment=sim_to_real``: the same requests through ``executor=real`` and a profiled
simulation, and the error between them (docs/sim_to_real.md)."""
