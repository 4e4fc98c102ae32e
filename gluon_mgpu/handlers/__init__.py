"""What hangs around the chapter's step: event handlers (docs/events.md) for checkpoints,
progress, metrics, plots, loss checks and interrupts, in ``gluon.contrib.estimator``'s vocabulary."""
