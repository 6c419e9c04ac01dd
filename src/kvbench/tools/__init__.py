"""Developer tools: the engine benchmark and the kernel-overhead CI gate."""
