"""``task=kernel_overhead``: what paging costs decode attention, on block tables from a replay."""
