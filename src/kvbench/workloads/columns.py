"""Names of the columns of a kvbench trace DataFrame (the contract of ``load_trace``)."""

from __future__ import annotations

REQUEST_ID = "request_id"
ARRIVAL_S = "arrival_s"
PROMPT_TOKENS = "prompt_tokens"
OUTPUT_TOKENS = "output_tokens"

# Optional columns: shared-prefix identity, as kvbench.core.request.Request models it.
PREFIX_GROUP = "prefix_group"
PREFIX_TOKENS = "prefix_tokens"
PREFIX_BLOCK_HASHES = "prefix_block_hashes"
# Parallel samples (n) generated from the request's prompt.
NUM_SAMPLES = "num_samples"
# Beam width (k) of beam search over the request's prompt.
BEAM_WIDTH = "beam_width"

REQUIRED_COLUMNS = (REQUEST_ID, ARRIVAL_S, PROMPT_TOKENS, OUTPUT_TOKENS)
OPTIONAL_COLUMNS = (PREFIX_GROUP, PREFIX_TOKENS, PREFIX_BLOCK_HASHES, NUM_SAMPLES, BEAM_WIDTH)

# DataFrame.attrs key holding the tokens covered by one entry of ``prefix_block_hashes``.
HASH_BLOCK_TOKENS_ATTR = "hash_block_tokens"
# Mooncake's hash_ids each name one 512-token prompt block (FAST'25 trace README).
MOONCAKE_HASH_BLOCK_TOKENS = 512
