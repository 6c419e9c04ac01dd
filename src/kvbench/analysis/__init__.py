"""Analyses over result tables: knees, throughput curves, fleet capacity, the paper's figures."""
