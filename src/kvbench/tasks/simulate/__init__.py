"""``task=simulate``: replay workloads through every allocator, then the sweep analyses."""
