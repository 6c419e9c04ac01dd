"""The core records: model and GPU specs (the only place bytes are computed), the catalog,
Request.
"""
