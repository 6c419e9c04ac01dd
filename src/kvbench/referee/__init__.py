"""The referee: real vLLM's scheduler driven step by step on kvbench's requests.

An edge of the pipeline, beside ``tasks/``: it imports vLLM (lazily, only when a referee runs),
never the other way round. ``token_ids`` turns a request's prefix identity into the token ids vLLM
hashes; ``vllm_v1`` runs ``vllm.v1.core.sched.scheduler.Scheduler`` without a model and returns
one record per step; ``vllm_capacity`` sizes a deployment's pool with vLLM's own
``kv_cache_utils``. Installing vLLM: docs/referee.md.
"""
