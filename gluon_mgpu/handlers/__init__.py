"""What hangs around the chapter's step: event handlers for checkpoints, progress, metrics, plots,
loss checks and interrupts, in ``gluon.contrib.estimator``'s vocabulary (docs/events.md).
"""
