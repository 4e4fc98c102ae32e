"""Figures of a run and of a sweep as image files (PNG, or SVG and PNG), drawn with matplotlib's
file-only Agg backend and without ``pyplot`` (docs/outputs.md).
"""
import os

from .events import PRIORITY, EpochEnd
from ..runtime.files import atomic_path

__all__ = ['PLOT_SUFFIXES', 'FIGSIZE', 'SWEEP_FIGSIZE', 'DPI', 'plot_paths', 'plot_history',
           'plot_sweep', 'PlotHandler']

PLOT_SUFFIXES = ('.png', '.svg')
FIGSIZE = (6.0, 4.0)         # inches: 600 x 400 pixels at DPI
SWEEP_FIGSIZE = (10.0, 4.0)  # 1000 x 400
DPI = 100


def plot_paths(path):
    """Return the files written for ``path``: ``[x.png]``, or ``[x.svg, x.png]`` for ``x.svg``."""
    path = os.fspath(path)
    root, suffix = os.path.splitext(path)
    if suffix.lower() not in PLOT_SUFFIXES:
        raise ValueError('plot file %r must end in .png or .svg; for example curves.png' % path)
    return [path] if suffix.lower() == '.png' else [path, root + '.png']


def _figure(figsize):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    fig = Figure(figsize=figsize, dpi=DPI, layout='constrained')
    FigureCanvasAgg(fig)
    return fig


def _save(fig, path):
    """Save ``fig`` in every format ``path`` asks for, each file atomically."""
    targets = plot_paths(path)
    for target in targets:
        with atomic_path(target) as tmp:
            fig.savefig(tmp, format=os.path.splitext(target)[1].lower()[1:], dpi=DPI)
    return targets


def _epoch_axis(ax, num_epochs):
    ax.set_xlabel('epoch')
    # A small margin keeps the first and last markers whole (and one epoch is not degenerate).
    margin = 0.5 if num_epochs == 1 else 0.04 * (num_epochs - 1)
    ax.set_xlim(1 - margin, num_epochs + margin)
    if num_epochs <= 20:
        ax.set_xticks(range(1, num_epochs + 1))
    else:
        ax.xaxis.get_major_locator().set_params(integer=True)
    ax.grid(True, alpha=0.4)


def plot_history(history, path, title=None, num_epochs=None):
    """Draw test accuracy and training loss per epoch from ``train()``'s history into ``path``.

    ``path`` ends in ``.png`` or ``.svg`` (then a ``.png`` too: ``plot_paths``); the x axis
    runs to ``num_epochs`` (default the last in ``history``), so a figure redrawn after every
    epoch keeps its scale. Returns the files written.
    """
    plot_paths(path)
    if not history:
        raise ValueError('history is empty; plot after at least one epoch')
    epochs = [r['epoch'] for r in history]
    fig = _figure(FIGSIZE)
    # Accuracy on the left in [0, 1] as in the book's figure; the loss gets its own scale on
    # the right, so a large early loss does not flatten the accuracy curve.
    acc = fig.add_subplot()
    loss = acc.twinx()
    acc_line, = acc.plot(epochs, [r['test_acc'] for r in history], '-o', color='C0',
                         label='test acc')
    loss_line, = loss.plot(epochs, [r['train_loss'] for r in history], '--s', color='C1',
                           label='train loss')
    _epoch_axis(acc, num_epochs or epochs[-1])
    acc.set_ylim(0, 1)
    acc.set_ylabel('test acc', color='C0')
    loss.set_ylim(bottom=0)
    loss.set_ylabel('train loss', color='C1')
    last = history[-1]
    acc.annotate('%.2f' % last['test_acc'], (last['epoch'], last['test_acc']),
                 textcoords='offset points', xytext=(0, 7), ha='center', color='C0')
    acc.legend(handles=[acc_line, loss_line], loc='center right')
    if title:
        acc.set_title(title, fontsize='medium')
    return _save(fig, path)


def plot_sweep(rows, path, title=None):
    """Draw a sweep (``run_sweep``'s rows): test accuracy per epoch, images/s per device count
    (with perfect scaling from a 1-device row, if any); return the files written."""
    plot_paths(path)
    if not rows:
        raise ValueError('no sweep rows to plot; run at least one setting')
    fig = _figure(SWEEP_FIGSIZE)
    acc, speed = fig.subplots(1, 2)
    for row in rows:
        h = row['history']
        acc.plot([r['epoch'] for r in h], [r['test_acc'] for r in h], '-o',
                 label='%d device%s' % (row['num_devices'], '' if row['num_devices'] == 1 else 's'))
    _epoch_axis(acc, max(len(row['history']) for row in rows))
    acc.set_ylabel('test acc')
    acc.set_ylim(0, 1)
    acc.legend(loc='best')
    counts = [row['num_devices'] for row in rows]
    speed.plot(counts, [row['images_per_sec'] for row in rows], '-o', color='C0',
               label='measured')
    base = [row for row in rows if row['num_devices'] == 1]
    if base:
        speed.plot(counts, [base[0]['images_per_sec'] * n for n in counts], '--', color='gray',
                   label='linear scaling')
    speed.set_xlabel('devices')
    speed.set_ylabel('training images/s')
    speed.set_xticks(counts)
    speed.set_ylim(bottom=0)
    speed.grid(True, alpha=0.4)
    speed.legend(loc='best')
    if title:
        fig.suptitle(title, fontsize='medium')
    return _save(fig, path)


class PlotHandler(EpochEnd):
    """Event handler: redraw ``plot_history`` into ``path`` after every epoch."""

    priority = PRIORITY['PlotHandler']

    def __init__(self, path, title=None):
        self.path, self.title = path, title

    def epoch_end(self, estimator, *args, **kwargs):
        plot_history(estimator.history, self.path, title=self.title,
                     num_epochs=estimator.num_epochs)
