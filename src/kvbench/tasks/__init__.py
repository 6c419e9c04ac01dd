"""The app's tasks, each in one shape (run / table / plot): simulate, kernel overhead, logit
equivalence, report.
"""
