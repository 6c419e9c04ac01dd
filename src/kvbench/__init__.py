"""kvbench: how much of the KV-cache memory an LLM server holds is really used.

Replays real request traces through interchangeable KV-cache allocators (contiguous and paged),
a continuous-batching scheduler and a roofline cost model, and drives real attention kernels
with the allocators' block tables.
"""

from importlib.metadata import PackageNotFoundError, version

from kvbench import checkout_imports

try:
    __version__ = version("kvbench")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"

# From a checkout, its top-level kernels/ folder would hide Hugging Face's kernels package.
checkout_imports.install(__file__)
