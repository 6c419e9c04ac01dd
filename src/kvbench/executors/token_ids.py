"""Concrete prompt token ids for a kvbench request, inside a real model's vocabulary.

Traces give lengths, not text. Tokens named by the request's prefix identity take the referee's
ids (``referee.token_ids``: equal identity, equal ids) folded into the vocabulary, so a prefix
the allocator finds cached holds exactly the K/V this request would compute; every other token is
drawn from the request's own seeded generator (a real mix of tokens, not one repeated id).
"""

from __future__ import annotations

import random

from kvbench.core.request import Request
from kvbench.referee.token_ids import OWN_ID_BASE, prompt_token_ids


def prompt_ids(request: Request, vocab_size: int) -> list[int]:
    """The ``request.prompt_tokens`` token ids of ``request``'s prompt, each < ``vocab_size``."""
    identity_ids = prompt_token_ids(request, 0)  # own ids are redrawn below
    own = random.Random(request.request_id)
    return [
        own.randrange(vocab_size) if token >= OWN_ID_BASE else token % vocab_size
        for token in identity_ids
    ]
