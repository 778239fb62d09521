"""Running a plan: the Ray controller, the per-rank worker, stage records, and cluster submission.

Only this package imports Ray.
"""
