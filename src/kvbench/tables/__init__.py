"""Tables out: engine records to frames, parquet files (atomic, streamed), provenance, DONE
markers.
"""
