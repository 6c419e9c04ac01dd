"""Files out: parquet tables written atomically or streamed chunk by chunk, the provenance every
table carries (resolved config, package version, git commit), and the DONE markers of sweeps.
"""
