"""``task=paper_executed``: the vLLM paper's comparison served on a real model beside its
simulations (docs/paper_executed.md)."""
