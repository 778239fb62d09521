"""Running a plan: the Ray controller, the warm workers, stage records, locks and cluster submission.
Only this package imports Ray; it imports anything below it (stages only inside the workers)."""
