"""What the command lines show while training: a progress bar per epoch on a terminal, the book's
plain lines otherwise (docs/outputs.md, "What you see").
"""
import os
import sys
import time

from tqdm import tqdm

from .events import BatchEnd, EpochBegin, EpochEnd, TrainEnd, format_epoch

__all__ = ['MODES', 'choose_mode', 'Progress']

MODES = ('bar', 'lines', 'quiet')

# How often the running loss in the bar is refreshed: reading it waits for the devices.
LOSS_REFRESH_SECONDS = 0.5


def choose_mode(quiet=False, stream=None):
    """Return the output mode: ``'quiet'`` if asked, ``'bar'`` if ``stream`` (default
    ``sys.stdout``) is a terminal, else ``'lines'``."""
    if quiet:
        return 'quiet'
    isatty = getattr(sys.stdout if stream is None else stream, 'isatty', lambda: False)
    return 'bar' if isatty() else 'lines'


class Progress(EpochBegin, BatchEnd, EpochEnd, TrainEnd):
    """Event handler: the per-epoch output of a run, ``train(..., event_handlers=[Progress(4)])``.

    Replaces ``EpochLine``: the book's line after each epoch unless ``quiet``, and in ``'bar'``
    mode a bar of ``num_examples`` images (counting up without it) labelled ``label`` and
    ``epoch 2/4``. ``mode`` defaults to ``choose_mode(stream=stream)``, ``stream`` to
    ``sys.stdout``.
    """

    def __init__(self, num_epochs, num_examples=None, mode=None, stream=None, label=''):
        self.stream = sys.stdout if stream is None else stream
        self.mode = choose_mode(stream=self.stream) if mode is None else mode
        if self.mode not in MODES:
            raise ValueError('mode must be one of %s, got %r' % ('/'.join(MODES), self.mode))
        self.num_epochs, self.num_examples, self.label = num_epochs, num_examples, label
        self.bar = None
        self._loss_shown_at = 0.0
        self._epoch = self._examples = 0
        self._loss_sums = None

    def epoch_begin(self, estimator, *args, **kwargs):
        self._epoch = getattr(estimator, 'epoch', self._epoch + 1)
        self._examples = 0
        self._loss_sums = None

    def _running_loss(self):
        # Reading the sums waits for the devices: only when the bar shows it.
        return sum(float(s.asscalar()) for s in self._loss_sums) / self._examples

    def batch_end(self, estimator, *args, **kwargs):
        if self.mode != 'bar':
            return
        losses = kwargs['loss']
        sums = [l.sum() for l in losses]
        self._loss_sums = sums if self._loss_sums is None else [
            a + b for a, b in zip(self._loss_sums, sums)]
        batch = kwargs.get('batch')
        examples = batch[0].shape[0] if batch else sum(l.shape[0] for l in losses)
        self._examples += examples
        if self.bar is None:
            # tqdm hides the bar on a terminal that reports a size of 0 x 0 (a pseudo-terminal
            # nobody sized), so such a terminal gets a fixed size.
            try:
                sized = os.get_terminal_size(self.stream.fileno()).columns > 0
            except (AttributeError, OSError, ValueError):
                sized = False
            self.bar = tqdm(total=self.num_examples, unit='img', file=self.stream, leave=False,
                            dynamic_ncols=sized, ncols=None if sized else 100,
                            nrows=None if sized else 24,
                            desc='%sepoch %d/%d' % (self.label, self._epoch, self.num_epochs))
        self.bar.update(examples)
        now = time.monotonic()
        if self._loss_shown_at == 0.0 or now - self._loss_shown_at >= LOSS_REFRESH_SECONDS:
            self._loss_shown_at = now
            self.bar.set_postfix(loss='%.4f' % self._running_loss())

    def epoch_end(self, estimator, *args, **kwargs):
        self.close()
        if self.mode != 'quiet':
            print(format_epoch(estimator.record), file=self.stream, flush=True)

    def train_end(self, estimator, *args, **kwargs):
        self.close()

    def close(self):
        """Remove the bar, if one is shown (call it also when training stops with an error)."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        self._loss_shown_at = 0.0
