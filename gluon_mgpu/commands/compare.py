"""The book's printed outputs next to ours: ``python -m gluon_mgpu.compare`` re-runs the chapter's
cells whose output does not depend on the hardware and runs its ``train`` beside ours over whole
epochs. The accuracy table over seeds is docs/book-comparison.md's, measured once. Library
functions return rows; only ``main`` prints (``--json``: all of it as data). docs/notebooks.md
explains each row.
"""
import contextlib
import importlib.util
import io
import json
import os
import re
import signal
import subprocess
import sys

import numpy as np

from ..assembly import runs
from ..devices import format_devices, simulated
from ..replicas import inspection_cells
from . import cli


# What the book prints, copied as data from the rendered English MXNet page (d2l.ai, "Gluon
# Implementation for Multi-GPU Computation"), run on two GPUs.
BOOK = {
    'out4': (
        """[[ 5.4814936e-06 -8.3371094e-07 -1.6316770e-06 -6.3674099e-07
  -3.8216162e-06 -2.3514044e-06 -2.5469599e-06 -9.4784696e-08
  -6.9033558e-07  2.5756231e-06]
 [ 5.4710872e-06 -9.4246496e-07 -1.0494070e-06  9.8081841e-08
  -3.3251815e-06 -2.4862918e-06 -3.3642798e-06  1.0455864e-07
  -6.1001344e-07  2.0327841e-06]]""",
        """[[ 5.6176345e-06 -1.2837586e-06 -1.4605541e-06  1.8302967e-07
  -3.5511653e-06 -2.4371013e-06 -3.5731798e-06 -3.0974860e-07
  -1.1016571e-06  1.8909889e-06]
 [ 5.1418697e-06 -1.3729932e-06 -1.1520088e-06  1.1507450e-07
  -3.7372811e-06 -2.8289724e-06 -3.6477197e-06  1.5781629e-07
  -6.0733043e-07  1.9712013e-06]]"""),
    # The same printed block for gpu(0) and gpu(1).
    'out5': """[[[-0.01473444 -0.01073093 -0.01042483]
  [-0.01327885 -0.01474966 -0.00524142]
  [ 0.01266256  0.00895064 -0.00601594]]]""",
    'not_initialized': 'not initialized on cpu(0)',
    'devices': ('gpu(0)', 'gpu(1)'),
}
OUT4_RTOL = 1e-4
# The repository: ``chapter_cells``' new process imports the package from it.
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_NUMBER = re.compile(r'[-+]?\d+\.\d+(?:e[-+]\d+)?')


def printed_numbers(text):
    """Return the numbers in an NDArray's printed text, as the printed strings, in order."""
    return _NUMBER.findall(text)


def format_like_book(values):
    """Print a float32 array the way MXNet's ``NDArray.__repr__`` does (numpy's defaults)."""
    with np.printoptions(precision=8, floatmode='maxprec', suppress=False, threshold=1000,
                         linewidth=75, sign='-'):
        return str(np.asarray(values, dtype=np.float32))


def chapter_cells(devices, fresh_process=True):
    """Run the chapter's ``In [2]`` to ``In [5]`` on two ``devices``, by default in a new Python
    process, whose MXNet random state is the default one (the book's values need it untouched).

    Returns
    -------
    dict
        ``devices`` (names), ``outputs`` (``Out[4]``: a 2x10 list per device), ``weights``
        (``Out[5]``: ``weight.data(device)[0]`` per device), ``default_read`` (``raised`` and
        ``printed``: what ``weight.data()`` without a device did) and ``mxnet_version``.

    Raises
    ------
    RuntimeError
        If the new process fails; the message holds the end of its error output.
    """
    if fresh_process:
        code = ('import sys; from gluon_mgpu.commands.compare import _cells_child; '
                '_cells_child(*sys.argv[1:])')
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(  # the repository first
            p for p in (ROOT, os.environ.get('PYTHONPATH')) if p))
        result = subprocess.run([sys.executable, '-c', code, ','.join(str(d) for d in devices),
                                 str(os.getpid())], capture_output=True, text=True, env=env,
                                timeout=600)
        if result.returncode != 0:
            raise RuntimeError('running the chapter\'s cells in a new process failed (exit %d): '
                               '%s' % (result.returncode, result.stderr.strip()[-2000:]))
        return json.loads(result.stdout.splitlines()[-1])
    import mxnet as mx

    from ..training import INIT_SIGMA
    if len(devices) != 2:
        raise ValueError('the chapter splits its batch over 2 devices, got %d (%s); pass two '
                         'contexts' % (len(devices), devices))
    cells = inspection_cells(devices, INIT_SIGMA)
    outputs, weight = cells['outputs'], cells['weight']
    try:
        weight.data()
        default_read = {'raised': False, 'printed': 'no error: %s holds a replica' % mx.cpu()}
    except RuntimeError:
        default_read = {'raised': True, 'printed': 'not initialized on %s' % mx.cpu()}
    return {'devices': [str(d) for d in devices],
            'outputs': [o.asnumpy().tolist() for o in outputs],
            'weights': [weight.data(d)[0].asnumpy().tolist() for d in devices],
            'default_read': default_read,
            'mxnet_version': mx.__version__}


def _cells_child(names, parent):
    """The new process of ``chapter_cells``: print the cells as JSON; it ends with process
    ``parent``, however that ends (a signal that another of its threads received ends it
    without killing this one: ``cli.die_with``)."""
    cli.die_with(int(parent), signal.SIGKILL)
    import mxnet as mx
    devices = [mx.Context(kind, int(i)) for kind, i in re.findall(r'(cpu|gpu)\((\d+)\)', names)]
    print(json.dumps(chapter_cells(devices, fresh_process=False)))


def book_train(num_gpus, batch_size, lr, net, gb, devices, num_epochs=4, on_step=None):
    """The chapter's ``train`` (``In [6]``) as printed, changed only where it cannot run here:
    ``ctx`` is ``devices[:num_gpus]`` (the book: ``[mx.gpu(i) for i in range(num_gpus)]``),
    ``range(4)`` is ``range(num_epochs)``, ``gb`` is passed in (d2lzh, or an object with its
    ``load_data_fashion_mnist`` and ``evaluate_accuracy``) and so is ``net`` (a global there).
    ``on_step(ls)``, when given, sees each step's losses after ``trainer.step``. The oracle of
    the whole-epoch equality: never used to train the package's runs.

    Returns
    -------
    list of float
        Each epoch's ``test_acc`` (device 0's parameters, as the book evaluates).
    """
    import time

    from mxnet import autograd, gluon, init, nd
    from mxnet.gluon import loss as gloss, utils as gutils

    accuracies = []
    train_iter, test_iter = gb.load_data_fashion_mnist(batch_size)
    ctx = list(devices[:num_gpus])
    print('running on:', ctx)
    net.initialize(init=init.Normal(sigma=0.01), ctx=ctx, force_reinit=True)
    trainer = gluon.Trainer(
        net.collect_params(), 'sgd', {'learning_rate': lr})
    loss = gloss.SoftmaxCrossEntropyLoss()
    for epoch in range(num_epochs):
        start = time.time()
        for X, y in train_iter:
            gpu_Xs = gutils.split_and_load(X, ctx)
            gpu_ys = gutils.split_and_load(y, ctx)
            with autograd.record():
                ls = [loss(net(gpu_X), gpu_y)
                      for gpu_X, gpu_y in zip(gpu_Xs, gpu_ys)]
            for l in ls:
                l.backward()
            trainer.step(batch_size)
            if on_step is not None:
                on_step(ls)
        nd.waitall()
        train_time = time.time() - start
        test_acc = gb.evaluate_accuracy(test_iter, net, ctx[0])
        print('epoch %d, training time: %.1f sec, test_acc %.2f' % (
            epoch + 1, train_time, test_acc))
        accuracies.append(test_acc)
    return accuracies


# The equality of whole epochs: 4 batches of 32 per device and a short last one of 16, twice.
EQUALITY_EPOCHS, EQUALITY_SEED, EQUALITY_TEST_LIMIT, EQUALITY_PER_DEVICE = 2, 7, 200, 32


def _arrays(net, devices):
    """Every parameter and running statistic of ``net`` on every device, in order."""
    return [p.data(d).asnumpy() for p in net.collect_params().values() for d in devices]


def _most(pairs):
    return max((float(np.max(np.abs(a.astype(np.float64) - b))) for a, b in pairs), default=0.0)


def equality_sizes(num_devices, per_device=EQUALITY_PER_DEVICE):
    """``(batch size, training images)`` of ``epoch_equality`` on ``num_devices``."""
    return per_device * num_devices, 4 * per_device * num_devices + per_device // 2


def epoch_equality(devices, data_dir=None, epochs=EQUALITY_EPOCHS, seed=EQUALITY_SEED,
                   test_limit=EQUALITY_TEST_LIMIT, per_device=EQUALITY_PER_DEVICE):
    """Train with the chapter's ``train`` as printed (``book_train``, d2lzh's network) and with
    ``gluon_mgpu.train`` (ours, hybridized) from ``mx.random.seed(seed)``, on the same batches
    (the book's lr per device, 4 batches of ``per_device`` per device and a short one of half
    that per epoch: ``equality_sizes``); compare them after every step and epoch.

    Returns
    -------
    dict
        ``sizes``: our batch sizes in order; ``steps``; ``loss``, ``trained``, ``running``: the
        largest difference of any step's losses, of any trained array and of any running
        statistic after any epoch, on any device; ``arrays``: (trained, running) arrays per
        device; ``test_acc``: per epoch ``(book, ours)``, both with device 0's parameters as
        the book evaluates; ``history``: ours; ``ours_arrays``: our arrays after each epoch
        (``_arrays`` order); ``book_printed``: the lines the book's ``train`` printed;
        ``batch_size``, ``lr``, ``train_limit``, ``test_limit``.
    """
    from types import SimpleNamespace

    import d2lzh
    import mxnet as mx

    from .. import training
    from ..data import load_data_fashion_mnist
    from ..handlers.events import BatchEnd, EpochEnd

    batch_size, train_limit = equality_sizes(len(devices), per_device)
    lr = training.LR_PER_DEVICE * len(devices)

    def load(size):
        return load_data_fashion_mnist(size, data_dir=data_dir, train_limit=train_limit,
                                       test_limit=test_limit, seed=seed)

    theirs = d2lzh.resnet18(10)
    book = {'losses': [], 'arrays': []}
    per_epoch = len(load(batch_size)[0])

    def book_step(ls):
        book['losses'].append([l.asnumpy() for l in ls])
        if len(book['losses']) % per_epoch == 0:
            book['arrays'].append(_arrays(theirs, devices))

    gb = SimpleNamespace(load_data_fashion_mnist=load, evaluate_accuracy=d2lzh.evaluate_accuracy)
    mx.random.seed(seed)
    with contextlib.redirect_stdout(io.StringIO()) as printed:  # the book's lines, kept
        book_acc = book_train(len(devices), batch_size, lr, theirs, gb, devices, epochs,
                              book_step)

    class Watch(BatchEnd, EpochEnd):
        def __init__(self):
            self.losses, self.arrays, self.device0_acc, self.sizes = [], [], [], []

        def batch_end(self, estimator, *args, **kwargs):
            self.losses.append([l.asnumpy() for l in kwargs['loss']])
            self.sizes.append(kwargs['batch'][0].shape[0])

        def epoch_end(self, estimator, *args, **kwargs):
            self.arrays.append(_arrays(estimator.net, devices))
            self.device0_acc.append(training.evaluate_accuracy(estimator.test_iter,
                                                               estimator.net, devices[:1]))

    ours, watch = training.new_network('resnet18'), Watch()
    train_iter, test_iter = load(batch_size)
    mx.random.seed(seed)
    history = training.train(ours, train_iter, test_iter, devices, num_epochs=epochs,
                             trainer=training.init_training(ours, devices, lr),
                             event_handlers=[watch])
    grads = [p.grad_req != 'null' for p in ours.collect_params().values() for _ in devices]

    def by_kind(trained):
        return [(t, o) for b, w in zip(book['arrays'], watch.arrays)
                for t, o, g in zip(b, w, grads) if g == trained]

    same = len(book['losses']) == len(watch.losses) and all(
        len(t) == len(o) for t, o in zip(book['arrays'], watch.arrays))
    return {'sizes': watch.sizes, 'steps': len(watch.losses),
            'loss': _most((a, b) for s, t in zip(book['losses'], watch.losses)
                          for a, b in zip(s, t)) if same else float('inf'),
            'trained': _most(by_kind(True)) if same else float('inf'),
            'running': _most(by_kind(False)) if same else float('inf'),
            'arrays': (sum(grads) // len(devices), (len(grads) - sum(grads)) // len(devices)),
            'test_acc': list(zip(book_acc, watch.device0_acc)), 'history': history,
            'ours_arrays': watch.arrays, 'book_printed': printed.getvalue().splitlines(),
            'batch_size': batch_size, 'lr': lr,
            'train_limit': train_limit, 'test_limit': test_limit}


def _abbrev(values, fmt):
    flat = np.asarray(values, dtype=np.float64).ravel()
    shape = 'x'.join(str(s) for s in np.shape(values))
    return '%s: %s ... %s' % (shape, fmt % flat[0], fmt % flat[-1])


def _row(cell, what, book, ours, diff, verdict, status):
    return {'cell': cell, 'what': what, 'book': book, 'ours': ours, 'diff': diff,
            'verdict': verdict, 'status': status}


def _judged(cell, what, book, ours, diff, ok, why='', why_not=None):
    """A row whose verdict is ``match<why>``, or ``MISMATCH<why_not>`` (default ``why``)."""
    verdict = 'match' + why if ok else 'MISMATCH' + (why if why_not is None else why_not)
    return _row(cell, what, book, ours, diff, verdict, 'match' if ok else 'mismatch')


def deterministic_rows(cells):
    """Compare ``Out[4]``, the ``In [5]`` print and ``Out[5]`` with the book; return rows: dicts
    of the ``_COLUMNS`` keys and ``status``, ``'match'``, ``'mismatch'`` or ``'explained'``
    (differs for a stated reason that is not an error)."""
    rows = []
    for i, (text, ours) in enumerate(zip(BOOK['out4'], cells['outputs'])):
        book = np.array([float(v) for v in printed_numbers(text)]).reshape(2, 10)
        ours = np.asarray(ours, dtype=np.float64)
        rel = np.abs(ours - book) / np.abs(book)
        ok = ours.shape == book.shape and bool(np.all(rel <= OUT4_RTOL))
        rows.append(_judged('Out[4]', 'net(x), device %d' % i, _abbrev(book, '%.7e'),
                            _abbrev(ours, '%.7e'), 'max rel %.1e' % rel.max(), ok,
                            ' (rtol %.0e per element)' % OUT4_RTOL))

    read, what = cells['default_read'], 'weight.data(), no device'
    if read['raised']:
        ok = read['printed'] == BOOK['not_initialized']
        rows.append(_judged('In [5]', what, BOOK['not_initialized'], read['printed'],
                            'none' if ok else 'text differs', ok))
    else:
        rows.append(_row(
            'In [5]', what, BOOK['not_initialized'], read['printed'], 'no error',
            'explained: the default device cpu(0) is one of ours (%s), so it holds a replica; '
            'on GPUs the book\'s line appears' % ', '.join(cells['devices']), 'explained'))

    book_tokens = printed_numbers(BOOK['out5'])
    book = np.array([float(v) for v in book_tokens]).reshape(1, 3, 3)
    for i, ours in enumerate(cells['weights']):
        ours_tokens = printed_numbers(format_like_book(ours))
        same = sum(a == b for a, b in zip(book_tokens, ours_tokens))
        rows.append(_judged('Out[5]', 'first conv weight, device %d' % i, _abbrev(book, '%.8f'),
                            _abbrev(ours, '%.8f'),
                            '%d/%d printed equal' % (same, len(book_tokens)),
                            len(ours_tokens) == len(book_tokens) == same,
                            ' (every printed digit)', ' (printed digits differ)'))
    first, second = (np.asarray(w) for w in cells['weights'])
    ok = np.array_equal(first, second)
    rows.append(_judged('Out[5]', 'device 0 vs device 1', 'identical',
                        'identical' if ok else 'differ',
                        'max abs %.1e' % np.abs(first - second).max(), ok))
    return rows


def step_row(devices, data_dir=None):
    """Run ``epoch_equality`` on ``devices`` and return its row of the table."""
    found = epoch_equality(devices, data_dir)
    biggest = max(found['loss'], found['trained'], found['running'])
    sizes = found['sizes'][:found['steps'] // EQUALITY_EPOCHS]
    what = ('the book\'s train, %d epochs of %d batches (%d, ..., %d) on %d devices'
            % (EQUALITY_EPOCHS, len(sizes), sizes[0], sizes[-1], len(devices)))
    return _judged('In [6]', what,
                   "d2lzh.resnet18, the book's train", 'gluon_mgpu.train, hybridized',
                   'max abs %.1e (losses, %d + %d arrays per device); test_acc %s'
                   % (biggest, found['arrays'][0], found['arrays'][1], ', '.join(
                       '%.3f vs %.3f' % pair for pair in found['test_acc'])),
                   biggest == 0.0 and all(b == o for b, o in found['test_acc']),
                   ' (bit for bit)', '')


_COLUMNS = (('cell', 'cell'), ('what', 'what'), ('book', "book's value"), ('ours', 'ours'),
            ('diff', 'difference'), ('verdict', 'verdict'))


def format_table(rows):
    """Format rows as a plain-text table, one line per row."""
    lines = [[title for _, title in _COLUMNS]] + [[str(r[key]) for key, _ in _COLUMNS]
                                                  for r in rows]
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]) - 1)]
    rule = ['-' * w for w in widths] + ['-' * len(lines[0][-1])]
    return '\n'.join(('  '.join(c.ljust(w) for c, w in zip(line, widths)) + '  '
                      + line[-1]).rstrip() for line in [lines[0], rule] + lines[1:])


def notes():
    """Return the lines that say how each kind of row is judged."""
    return [
        'Out[4], Out[5]: the chapter\'s cells re-run in a new process, so from MXNet\'s default '
        'random seed and in the book\'s order; Out[4] must agree within rtol %.0e per element '
        '(another machine sums in another order), Out[5] to every printed digit (the weights '
        'are drawn on the CPU, also when the devices are GPUs).' % OUT4_RTOL,
        'The step: the chapter\'s train as printed, with its own network (d2lzh.resnet18), '
        'beside gluon_mgpu.train with ours, hybridized, from the same seed and batches over '
        'whole epochs, each ending with a short batch (trainer.step(batch_size) divides it by '
        'the nominal size): every loss, parameter and running statistic on every device, and '
        'each epoch\'s test accuracy, must be equal bit for bit.',
    ]


def describe_devices(devices):
    """One line: the book's devices and ours."""
    return 'devices: the book %s; ours %s%s' % (
        format_devices(BOOK['devices']), format_devices(devices),
        ', simulated on the CPU (no GPU used)' if simulated(devices) else '')


PROG = 'python -m gluon_mgpu.compare'
# The command's last line: the accuracy table over seeds is measured once, in the docs.
ACCURACY_TABLE = ('the book\'s accuracy table beside the published GPU runs and our runs over '
                  'seeds: docs/book-comparison.md (from the record, '
                  'docs/records/book-table.jsonl)')


# The book's own package, whose network the step row trains: gluon_mgpu's test extra, not a
# requirement of the package (setup.py).
BOOK_PACKAGE = 'd2lzh==1.0.0'


def build_parser():
    p = cli.Parser(prog=PROG, description='Re-run the chapter\'s cells and its train, and print '
                   'a table: the book\'s printed values, ours, the difference, a verdict. The '
                   'book\'s accuracy table over seeds is docs/book-comparison.md.')
    p.add_device_flag()
    p.add_argument('--data-dir', metavar='DIR',
                   help='the folder of the four Fashion-MNIST files (default: searched; '
                        'docs/testing.md)')
    p.add_argument('--json', action='store_true',
                   help='print one JSON object instead: the devices line, the rows, the notes, '
                        'and the book\'s printed Out[4] and Out[5] beside ours, printed as the '
                        'book prints them')
    p.add_debug_flag()
    return p


def _parse_args(argv):  # the flags, then d2lzh: a step row without it is bad input
    args = build_parser().parse_args(argv)
    if importlib.util.find_spec('d2lzh') is None:  # after a plain pip install .
        raise cli.UsageError(
            "the step row trains the book's own network, from its package d2lzh, which is "
            "not installed for %s; install it with pip install %s (or gluon_mgpu's test "
            "extra: pip install '.[test]')" % (sys.executable, BOOK_PACKAGE))
    return args


def main(argv=None):
    """Entry point of ``python -m gluon_mgpu.compare``; returns the exit code: 1 when a row of
    the port is a mismatch, 2 for bad input or without d2lzh (``BOOK_PACKAGE``)."""
    return cli.run_report(PROG, sys.argv[1:] if argv is None else list(argv), _parse_args,
                          _compare, 'before the table was printed')


def _compare(args):
    from ..data import DataError, DataNotFoundError, load_data_fashion_mnist
    from ..devices import get_devices
    batch_size, train_limit = equality_sizes(2)
    try:  # the step row's data, read now: a damaged file is found before the cells run
        load_data_fashion_mnist(batch_size, data_dir=args.data_dir, train_limit=train_limit,
                                test_limit=EQUALITY_TEST_LIMIT)
    except (DataError, DataNotFoundError) as e:
        raise runs.data_error(e, args.data_dir) from None
    except ValueError as e:
        raise cli.UsageError('%s: the step row trains on %d images and tests on %d, more than '
                             'it holds (%s); give the whole data set'
                             % ('--data-dir %s' % args.data_dir if args.data_dir else
                                'the data', train_limit, EQUALITY_TEST_LIMIT,
                                str(e).split(';')[0])) from None
    try:
        pair = get_devices(2, args.device)
    except ValueError as e:
        raise cli.UsageError('--device %s: %s' % (args.device, e)) from None
    cells = chapter_cells(pair)
    rows = deterministic_rows(cells) + [step_row(pair, args.data_dir)]
    if args.json:
        print(json.dumps({'devices': describe_devices(pair), 'rows': rows, 'notes': notes(),
                          'book': BOOK, 'ours': {'devices': cells['devices'], 'out4': [
                              format_like_book(v) for v in cells['outputs']], 'out5': [
                              format_like_book(v) for v in cells['weights']]}}, indent=1))
    else:
        print('\n'.join([describe_devices(pair), format_table(rows), ''] +
                        ['note: ' + line for line in notes()] + [ACCURACY_TABLE]))
    return 1 if any(r['status'] == 'mismatch' for r in rows) else 0
