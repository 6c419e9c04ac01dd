"""Executors: what runs an iteration the engine scheduled, on a real model (an edge, like tasks).

The engine stays pure: ``simulate`` prices iterations with a cost model. ``executor=real`` instead
hands every scheduled batch to ``real.RealExecutor``, which runs a batched forward pass of a
transformers causal LM whose K/V live in the allocator's own memory (``kv_memory``): the paged
allocators' block pools indexed by their block tables, the naive allocators' contiguous arena at
their buddy offsets. ``real_loop.run_real`` is the engine's step-by-step loop on the wall clock,
recording measured iteration times in the same records ``simulate`` returns. ``profile`` measures
iteration times over a grid and fits the ``engine.profiled.ProfiledCostModel`` that
``executor=profiled`` simulates with.

Importing this package imports no torch; its modules do.
"""
