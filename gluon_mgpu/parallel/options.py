"""Choosing a way to split training: the checks of the flags, the ``--cut`` parser and the
constructor the command line calls (docs/three-ways.md).
"""
from ..runtime.checks import is_whole
from ..runtime.choices import METHODS
from .channels import ChannelSplitNet
from .layers import CUT_RULES, LayerSplit
from .scratch import ScratchDataParallel

__all__ = ['METHODS', 'check_parallel_options', 'parse_cut', 'make_parallel']


def parse_cut(text):
    """Read ``--cut``: ``'params'``, ``'time'`` or unit names separated by commas.

    ``'stage2'`` gives ``('stage2',)``, ``'stage1,stage3'`` gives ``('stage1', 'stage3')``;
    whether the names exist is checked when the network is split.
    """
    if text in CUT_RULES:
        return text
    names = tuple(n.strip() for n in text.split(','))
    if not text.strip() or not all(names):
        raise ValueError("--cut %r: give 'params', 'time' or the names of the units after which "
                         "to cut, separated by commas (e.g. stage2)" % (text,))
    return names


def check_parallel_options(parallel, num_devices, micro_batches=1, batch_size=None,
                           cut='params', model=None, hybridize=None, data_only=()):
    """Raise ValueError (one line naming the flag, the value and the fix) for a bad combination
    of options; return None when they fit together.

    ``model`` and ``hybridize`` are the user's ``--model`` and explicit ``--hybridize`` (None
    when not given), which ``scratch`` refuses; ``data_only`` the flags given that only
    ``--parallel data`` understands (``--kvstore dist_sync``, ``--sync-bn``, ...).
    """
    if parallel not in METHODS:
        raise ValueError('--parallel %r: choose one of %s' % (parallel, ', '.join(METHODS)))
    if not is_whole(num_devices):
        raise ValueError('%r devices: pass a whole number >= 1' % (num_devices,))
    if not is_whole(micro_batches):
        raise ValueError('--micro-batches %r: pass a whole number >= 1' % (micro_batches,))
    if micro_batches > 1 and parallel != 'layers':
        raise ValueError('--micro-batches %d pipelines the layer split; pass --parallel layers '
                         'or drop --micro-batches' % micro_batches)
    if batch_size is not None and micro_batches > batch_size:
        raise ValueError('--micro-batches %d but the batch has %d examples; use at most %d '
                         'micro-batches' % (micro_batches, batch_size, batch_size))
    if cut != 'params' and parallel != 'layers':
        raise ValueError('--cut %s chooses where the layer split cuts; pass --parallel layers '
                         'or drop --cut' % (cut if isinstance(cut, str) else ','.join(cut)))
    if parallel == 'scratch':
        if model is not None:
            raise ValueError("--parallel scratch trains the book's LeNet written from scratch, "
                             "not --model %s; drop --model or pass --parallel data" % model)
        if hybridize:
            raise ValueError('--parallel scratch runs the network as plain functions, which '
                             'cannot be hybridized; pass --no-hybridize')
        if batch_size is not None and batch_size % num_devices:
            raise ValueError('--batch-size %d cannot be split evenly over %d devices, as the '
                             'book\'s split_batch needs; use a multiple of %d'
                             % (batch_size, num_devices, num_devices))
    for flag in data_only:
        if parallel != 'data':
            raise ValueError('%s works with --parallel data only; drop it or pass --parallel '
                             'data' % flag)


def make_parallel(parallel, devices, lr, net=None, micro_batches=1, cut='params', sample=None):
    """Build the split network for ``parallel`` in ``('scratch', 'layers', 'channels')``, with
    SGD at ``lr`` on ``devices``.

    ``net``: for ``layers`` and ``channels``, the one-device network (``init_one_device``),
    split in place (``scratch`` builds its own LeNet); ``micro_batches``, ``cut`` and ``sample``
    go to ``LayerSplit``. Each result has ``method``, ``devices``, ``train_batch(X, y)`` (the
    summed loss), ``__call__(X)``, ``evaluate_accuracy``, ``save_parameters``,
    ``load_parameters`` and ``summary(X)``.
    """
    if parallel == 'scratch':
        return ScratchDataParallel(devices, lr)
    if parallel not in ('layers', 'channels'):
        raise ValueError("make_parallel builds 'scratch', 'layers' or 'channels', got %r; the "
                         "chapter's data parallelism is gluon_mgpu.training.train" % (parallel,))
    if net is None:
        raise ValueError('--parallel %s splits a network: pass net, initialized on one device '
                         '(init_one_device)' % parallel)
    if parallel == 'layers':
        return LayerSplit(net, devices, lr, cut=cut, micro_batches=micro_batches, sample=sample)
    return ChannelSplitNet(net, devices, lr)

