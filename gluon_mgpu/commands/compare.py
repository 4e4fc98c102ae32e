"""The book's printed outputs next to ours: ``python -m gluon_mgpu.compare`` re-runs the chapter's
cells whose output does not depend on the hardware, runs its ``train`` beside ours over whole
epochs, and puts its accuracy table beside the published GPU runs and our recorded runs (made by
``benchmarks/book_table.py``). Library functions return rows; only ``main`` prints.
docs/notebooks.md explains each row; docs/book-comparison.md is the page.
"""
import contextlib
import io
import json
import os
import re
import subprocess
import sys

import numpy as np

from .. import training
from ..devices import format_devices, plural
from ..handlers.metrics import epoch_problem
from ..runtime.checks import is_whole
from . import cli

__all__ = ['BOOK', 'OUT4_RTOL', 'SPEEDUP_BAND', 'MIN_SEEDS', 'RUN_EPOCHS', 'ROOT',
           'DEFAULT_RECORD', 'OLD_STEP_RECORD', 'printed_numbers', 'format_like_book',
           'run_chapter_cells', 'chapter_cells', 'deterministic_rows', 'book_train',
           'equality_slice', 'epoch_equality', 'step_row', 'RecordError', 'read_records',
           'record_key', 'table_records', 'summarize', 'GPU_RUNS', 'read_gpu_runs',
           'gpu_summary', 'accuracy_cells', 'ACCURACY_TITLES', 'format_accuracy_cells',
           'VERDICT_WORDS', 'notebook_table', 'training_rows', 'is_simulated', 'notes',
           'describe_devices', 'format_table', 'format_table_lines', 'child_env', 'main']


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
    # In [7]: train(num_gpus=1, batch_size=256, lr=0.1); In [8]: num_gpus=2, 512, 0.2.
    'training': {
        1: {'cell': 'In [7]', 'batch_size': 256, 'lr': 0.1,
            'seconds': (63.5, 60.8, 61.0, 61.1), 'test_acc': (0.86, 0.91, 0.91, 0.93)},
        2: {'cell': 'In [8]', 'batch_size': 512, 'lr': 0.2,
            'seconds': (32.3, 31.5, 31.2, 31.3), 'test_acc': (0.77, 0.86, 0.88, 0.89)},
    },
    # The newer PyTorch edition (Chinese page), 10 epochs, prints one summary line per run:
    # "test acc: 0.92, 14.1 sec/epoch" on 1 GPU and "test acc: 0.87, 9.2 sec/epoch" on 2.
    'newer_edition': {1: {'sec_per_epoch': 14.1, 'test_acc': 0.92},
                      2: {'sec_per_epoch': 9.2, 'test_acc': 0.87}},
}


OUT4_RTOL = 1e-4


# Our 2-device speed-up divided by the book's 1.95x must fall in this range (1.46x to 2.15x).
SPEEDUP_BAND = (0.75, 1.10)


_NUMBER = re.compile(r'[-+]?\d+\.\d+(?:e[-+]\d+)?')


def printed_numbers(text):
    """Return the numbers in an NDArray's printed text, as the printed strings, in order."""
    return _NUMBER.findall(text)


def format_like_book(values):
    """Print a float32 array the way MXNet's ``NDArray.__repr__`` does (numpy's defaults)."""
    with np.printoptions(precision=8, floatmode='maxprec', suppress=False, threshold=1000,
                         linewidth=75, sign='-'):
        return str(np.asarray(values, dtype=np.float32))


def run_chapter_cells(devices):
    """Run the chapter's ``In [2]`` to ``In [5]`` in this process on two ``devices``; the values
    are the book's only if no MXNet random number was drawn before (``chapter_cells``).

    Returns
    -------
    dict
        ``devices`` (names), ``outputs`` (``Out[4]``: a 2x10 list per device), ``weights``
        (``Out[5]``: ``weight.data(device)[0]`` per device), ``default_read`` (``raised`` and
        ``printed``: what ``weight.data()`` without a device did) and ``mxnet_version``.
    """
    import mxnet as mx

    from .cli import inspection_cells

    if len(devices) != 2:
        raise ValueError('the chapter splits its batch over 2 devices, got %d (%s); pass two '
                         'contexts' % (len(devices), devices))
    cells = inspection_cells(devices)
    outputs, weight = cells['outputs'], cells['weight']
    try:
        weight.data()
        default_read = {'raised': False,
                        'printed': 'no error: %s holds a replica' % mx.cpu()}
    except RuntimeError:
        default_read = {'raised': True, 'printed': 'not initialized on %s' % mx.cpu()}
    return {'devices': [str(d) for d in devices],
            'outputs': [o.asnumpy().tolist() for o in outputs],
            'weights': [weight.data(d)[0].asnumpy().tolist() for d in devices],
            'default_read': default_read,
            'mxnet_version': mx.__version__}


def _cells_child(names):
    """The new process of ``chapter_cells``: print the cells as JSON."""
    import mxnet as mx
    devices = [mx.Context(kind, int(i)) for kind, i in re.findall(r'(cpu|gpu)\((\d+)\)', names)]
    print(json.dumps(run_chapter_cells(devices)))


def chapter_cells(devices, fresh_process=True):
    """``run_chapter_cells(devices)``, by default in a new Python process, whose MXNet random
    state is the default one whatever this process did before.

    Raises
    ------
    RuntimeError
        If the new process fails; the message holds the end of its error output.
    """
    if not fresh_process:
        return run_chapter_cells(devices)
    code = ('import sys; from gluon_mgpu.commands.compare import _cells_child; '
            '_cells_child(sys.argv[1])')
    result = subprocess.run([sys.executable, '-c', code, ','.join(str(d) for d in devices)],
                            capture_output=True, text=True, env=child_env(),
                            timeout=600)
    if result.returncode != 0:
        raise RuntimeError('running the chapter\'s cells in a new process failed (exit %d): %s'
                           % (result.returncode, result.stderr.strip()[-2000:]))
    return json.loads(result.stdout.splitlines()[-1])


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
EQUALITY_EPOCHS, EQUALITY_SEED, EQUALITY_TEST_LIMIT = 2, 7, 200


def equality_slice(num_devices):
    """``(batch_size, lr, train_limit)`` of ``epoch_equality`` on ``num_devices`` devices: the
    book's lr per device, 4 full batches and a short one of 16 per epoch."""
    batch_size = 32 * num_devices
    return batch_size, training.LR_PER_DEVICE * num_devices, 4 * batch_size + 16


def _arrays(net, devices):
    """Every parameter and running statistic of ``net`` on every device, in order."""
    return [p.data(d).asnumpy() for p in net.collect_params().values() for d in devices]


def _most(pairs):
    return max((float(np.max(np.abs(a.astype(np.float64) - b))) for a, b in pairs), default=0.0)


def epoch_equality(devices, data_dir=None, epochs=EQUALITY_EPOCHS, seed=EQUALITY_SEED,
                   test_limit=EQUALITY_TEST_LIMIT):
    """Train with the chapter's ``train`` as printed (``book_train``, d2lzh's network) and with
    ``gluon_mgpu.train`` (ours, hybridized) from ``mx.random.seed(seed)``, on the same batches
    (``equality_slice``: each epoch ends with a short batch); compare them after every step
    and epoch.

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

    from ..data import load_data_fashion_mnist
    from ..handlers.events import BatchEnd, EpochEnd

    batch_size, lr, train_limit = equality_slice(len(devices))

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
            return False

        def epoch_end(self, estimator, *args, **kwargs):
            self.arrays.append(_arrays(estimator.net, devices))
            self.device0_acc.append(training.evaluate_accuracy(estimator.test_iter,
                                                               estimator.net, devices[:1]))
            return False

    ours, watch = training.new_network('resnet18'), Watch()
    train_iter, test_iter = load(batch_size)
    mx.random.seed(seed)
    history = training.train(ours, train_iter, test_iter, devices, lr=lr, num_epochs=epochs,
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


def is_simulated(devices):
    """True when several devices are all CPU contexts: they share one CPU's cores."""
    names = [str(d) for d in devices]
    return len(names) > 1 and all(n.startswith('cpu') for n in names)


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


# A verdict needs a spread: with fewer seeds a row shows our values and is not judged.
MIN_SEEDS = 3


# The records of the full runs (benchmarks/book_table.py writes them): one JSON line per epoch.
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_RECORD = os.path.join(ROOT, 'docs', 'book-table.jsonl')
# The runs made with the old step (training.OLD_STEP), up to commit 03b47ec: kept apart.
OLD_STEP_RECORD = os.path.join(ROOT, 'docs', 'book-table-old-step.jsonl')
RUN_EPOCHS = 4  # the book's
RECORD_LIMIT = 16 << 20  # bytes; a line is about 700


class RecordError(ValueError):
    """The record file cannot be used: the message names the file, the line and the fix."""


def _whole(low, high):
    return (lambda v: type(v) is int and is_whole(v, low) and v <= high,
            'a whole number from %d to %d' % (low, high))


def _number(low, high):
    return (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
            and low <= v <= high, 'a number from %g to %g' % (low, high))


_ACCURACY = _number(0, 1)
# The setting and diagnosis of a line, as strict as the flags that made it (cli.seed, ...); the
# epoch's own numbers are the one epoch record (handlers.metrics.epoch_problem).
_FIELDS = {'devices': _whole(1, 1024), 'seed': _whole(0, 2 ** 31 - 1),
           'warmup_steps': _whole(0, 10 ** 9), 'batch_size': _whole(1, 10 ** 9),
           'lr': _number(1e-30, 1e30), 'acc_precise_bn': _ACCURACY, 'acc_batch_stats': _ACCURACY,
           'acc_running': (lambda v: isinstance(v, list) and all(_ACCURACY[0](a) for a in v),
                           'a list of accuracies')}
_LIMITS = {'train_limit': _whole(1, 10 ** 9), 'test_limit': _whole(1, 10 ** 9)}


def _check_line(record, path, number, step):
    def refuse(what):
        raise RecordError('%s, line %d: %s; fix or delete that line (the epoch is then trained '
                          'again)' % (path, number, what))
    if not isinstance(record, dict):
        refuse('not a JSON object')
    if record.get('step', training.OLD_STEP) != step:
        raise RecordError('%s, line %d: trained with %s, not %s; a record holds the runs of one '
                          'step only: keep the line in a record of its own (the old step\'s are '
                          'in %s)' % (path, number, str(record.get('step', training.OLD_STEP))[:40],
                                      step, os.path.relpath(OLD_STEP_RECORD, ROOT)))
    for name, (test, kind) in list(_FIELDS.items()) + list(_LIMITS.items()):
        if name not in record and name not in _LIMITS:
            refuse('it lacks %s' % name)
        value = record.get(name)
        if not (value is None and name in _LIMITS) and not test(value):
            refuse('%s is %s, not %s' % (name, _shown(value), kind))
    problem = epoch_problem(record)
    if problem:
        refuse(problem)
    if len(record['acc_running']) != record['devices']:
        refuse('acc_running holds %d accuracies for %d devices'
               % (len(record['acc_running']), record['devices']))
    if record.get('dtype', 'float32') not in ('float32', 'bfloat16'):
        refuse('dtype is %s, not "float32" or "bfloat16"' % _shown(record['dtype']))


def _shown(value):
    if isinstance(value, int) and abs(value) >= 2 ** 63:
        return 'a whole number of %d digits' % len(str(abs(value)))
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + '...'


def record_key(record):
    """What makes a run of the table, everything but the epoch: ``(devices, seed,
    warmup_steps, train_limit, test_limit, dtype)``."""
    return (record['devices'], record['seed'], record['warmup_steps'],
            record.get('train_limit'), record.get('test_limit'), record.get('dtype', 'float32'))


def read_records(path, step=training.STEP):
    """Read a record file (JSON, one epoch per line; none if it does not exist); return the
    checked lines as dicts, in order. An epoch recorded twice must carry the same accuracies (a
    retrained run repeats itself bit for bit) and counts once. Every line must have been
    trained with ``step`` (a line without ``step`` was trained with ``training.OLD_STEP``).

    Raises
    ------
    RecordError
        Naming the file, the line and what is wrong.
    """
    from ..runtime.files import InputError, open_input
    try:
        with open_input(path) as f:
            data = f.read(RECORD_LIMIT + 1)
        if len(data) > RECORD_LIMIT:
            raise RecordError('%s holds more than %d MB; pass --record with a record of the '
                              'book table' % (path, RECORD_LIMIT >> 20))
        text = data.decode('utf-8')
    except InputError as e:
        if e.reason == 'does not exist':
            return []
        raise RecordError('%s %s; pass --record with a regular file' % (path, e.reason)) from None
    except (OSError, UnicodeDecodeError) as e:
        raise RecordError('%s cannot be read (%s); pass --record with a readable file'
                          % (path, getattr(e, 'strerror', None) or e)) from None
    records, seen = [], {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line, parse_constant=lambda c: float('nan'))
        except (ValueError, RecursionError) as e:
            raise RecordError('%s, line %d: not JSON (%s); fix or delete that line'
                              % (path, number, str(e)[:80] or 'nested too deep')) from None
        _check_line(record, path, number, step)
        first = seen.setdefault((record_key(record), record['epoch']), record)
        if first is record:
            records.append(record)
        elif (first['test_acc'], first['acc_running']) != (record['test_acc'],
                                                            record['acc_running']):
            raise RecordError('%s, line %d: epoch %d of this run is recorded twice with '
                              'different accuracies (%s, then %s); keep one of the two lines'
                              % (path, number, record['epoch'], first['test_acc'],
                                 record['test_acc']))
    return records


def table_records(records, devices, warmup_steps=0, train_limit=None, test_limit=None,
                  dtype='float32', epochs=RUN_EPOCHS):
    """The records of one configuration, ``{epoch: [record per seed]}``, epochs 1 to
    ``epochs`` (a line beyond the run's epochs is no cell of the table)."""
    by_epoch = {}
    for r in records:
        key = record_key(r)
        if key[0] == devices and key[2:] == (warmup_steps, train_limit, test_limit, dtype) \
                and r['epoch'] <= epochs:
            by_epoch.setdefault(r['epoch'], []).append(r)
    return by_epoch


def summarize(values):
    """``{'n', 'mean', 'low', 'high'}`` of a list of numbers (None for an empty list)."""
    if not values:
        return None
    return {'n': len(values), 'mean': sum(values) / len(values), 'low': min(values),
            'high': max(values)}



# Published GPU runs of the chapter's training cells (docs/book-gpu-runs.md): the spread the
# book's printed table and ours are judged against.
GPU_RUNS = os.path.join(ROOT, 'docs', 'book-gpu-runs.csv')


SAME_CODE = 'd2l-zh 1.x (d2lzh, MXNet nd)'  # the chapter's exact code, 4 epochs


LATER = '(MXNet np)'  # the later MXNet editions of the same experiment (10 epochs)


def read_gpu_runs(path=GPU_RUNS):
    """The GPU runs' test accuracies: ``{('same', gpus, epoch): [...], ('later', gpus, epoch):
    [...]}`` for gpus 1, 2 and epochs 1-4 (the PyTorch edition's runs are left out).

    Raises
    ------
    ValueError
        Naming the file and line of a value that is not an accuracy.
    """
    import csv
    from ..runtime.files import open_input
    with open_input(path) as f:
        lines = f.read().decode('utf-8').splitlines()
    runs = {}
    for number, row in enumerate(csv.DictReader(lines), 2):
        edition = row.get('edition') or ''
        group = 'same' if edition == SAME_CODE else 'later' if edition.endswith(LATER) else None
        if group is None:
            continue
        for e in range(1, RUN_EPOCHS + 1):
            text = row.get('acc_e%d' % e) or ''
            if not text:
                continue  # a run of fewer epochs
            try:
                value = float(text)
            except ValueError:
                value = float('nan')
            if not 0 <= value <= 1 or row.get('gpus') not in ('1', '2'):
                raise ValueError('%s, line %d: acc_e%d is %r with gpus %r, not an accuracy '
                                 'from 0 to 1 on 1 or 2 GPUs' % (path, number, e, text,
                                                                 row.get('gpus')))
            runs.setdefault((group, int(row['gpus']), e), []).append(value)
    return runs


def gpu_summary(values):
    """``{'n', 'median', 'p10', 'p90', 'low', 'high'}`` of a list of accuracies."""
    v = np.asarray(values, dtype=np.float64)
    return {'n': len(v), 'median': float(np.median(v)), 'p10': float(np.percentile(v, 10)),
            'p90': float(np.percentile(v, 90)), 'low': float(v.min()), 'high': float(v.max())}


def accuracy_cells(records, runs, train_limit=None, test_limit=None):
    """The book's table judged against the GPU runs: one dict per setting (1, 2 devices) and
    epoch, with ``devices``, ``epoch``, ``book`` (its printed value), ``same`` and ``later``
    (``gpu_summary`` of the same-code runs and the later editions), ``ours`` and ``precise``
    (``summarize`` over seeds of device 0's test accuracy, the book's measure, and of precise
    BatchNorm's; None when not run), ``verdict`` and ``status``.

    A cell is judged with ``MIN_SEEDS`` seeds or more: our mean, printed to two digits as the
    runs are, must lie in the same-code runs' range (lowest-highest); at the last epoch it is
    also compared with their median.
    """
    cells = []
    for n in (1, 2):
        by_epoch = table_records(records, n, 0, train_limit, test_limit)
        for e, book in enumerate(BOOK['training'][n]['test_acc'], 1):
            rs = by_epoch.get(e, [])
            cell = {'devices': n, 'epoch': e, 'book': book,
                    'same': gpu_summary(runs['same', n, e]),
                    'later': gpu_summary(runs['later', n, e]),
                    'ours': summarize([r['acc_running'][0] for r in rs]),
                    'precise': summarize([r['acc_precise_bn'] for r in rs])}
            cell['verdict'], cell['status'] = _gpu_verdict(cell, e == len(
                BOOK['training'][n]['test_acc']))
            cells.append(cell)
    return cells


def _gpu_verdict(cell, last):
    ours, same = cell['ours'], cell['same']
    if ours is None:
        return 'not run (benchmarks/book_table.py)', 'not run'
    if ours['n'] < MIN_SEEDS:
        return ('not judged: %s so far, %d needed' % (plural(ours['n'], 'seed'), MIN_SEEDS),
                'not judged')
    mean = round(ours['mean'], 2)
    where = ('inside' if same['low'] <= mean <= same['high'] else
             'BELOW' if mean < same['low'] else 'ABOVE')
    verdict = '%s the same-code GPU runs\' range (%.2f-%.2f)' % (where, same['low'],
                                                                 same['high'])
    near = abs(ours['mean'] - same['median']) <= 0.01 + 1e-9
    if last:
        verdict += '; %s 0.01 of their median %.3f' % ('within' if near else 'NOT within',
                                                      same['median'])
    return verdict, 'match' if where == 'inside' and (near or not last) else 'mismatch'


def _median_range(s):
    return '%.2f (%.2f-%.2f)' % (s['median'], s['low'], s['high'])


def _median_p10_p90(s):
    return '%.3f (%.3f-%.3f)' % (s['median'], s['p10'], s['p90'])


def _mean_low_high(s, digits=2):
    if s is None:
        return '-'
    return '%.*f (%.*f-%.*f)' % (digits, s['mean'], digits, s['low'], digits, s['high'])


ACCURACY_TITLES = ['setting', 'epoch', 'book', 'same code on GPUs: median (range)',
                   'later MXNet editions on GPUs: median (10th-90th pct.)',
                   'ours: mean (lowest-highest)', 'seeds', 'ours, precise BatchNorm',
                   'verdict']


def format_accuracy_cells(cells):
    """``accuracy_cells`` as lists of cell texts, headed by ``ACCURACY_TITLES``."""
    return [ACCURACY_TITLES] + [
        [plural(c['devices'], 'device'), str(c['epoch']), '%.2f' % c['book'],
         _median_range(c['same']), _median_p10_p90(c['later']), _mean_low_high(c['ours']),
         str(c['ours']['n'] if c['ours'] else 0), _mean_low_high(c['precise'], 3),
         c['verdict']] for c in cells]


# The notebooks' verdict words (the rows' titles are each notebook's own).
VERDICT_WORDS = {'en': {'inside': 'inside', 'BELOW': 'BELOW', 'ABOVE': 'ABOVE'},
                 'zh': {'inside': '范围内', 'BELOW': '低于范围', 'ABOVE': '高于范围'}}


def notebook_table(cells, lang='en'):
    """The notebooks' table: per device count, the rows book, same-code GPU runs, later
    editions, ours and the verdict, one column per epoch, without the rows' titles (each
    notebook has its own, in its language; ``lang`` picks the verdict's words)."""
    words = VERDICT_WORDS[lang]
    rows = []
    for n in (1, 2):
        mine = [c for c in cells if c['devices'] == n]
        rows += [['%.2f' % c['book'] for c in mine],
                 [_median_range(c['same']) for c in mine],
                 [_median_p10_p90(c['later']) for c in mine],
                 [_mean_low_high(c['ours']) for c in mine],
                 [words[c['verdict'].split(' ')[0]] if c['status'] in ('match', 'mismatch')
                  else '-' for c in mine]]
    return rows


_NOT_RUN = ('not run', '', 'not run (benchmarks/book_table.py)', 'not run')


def training_rows(devices, records=(), train_limit=None, test_limit=None):
    """The seconds per epoch of the recorded runs beside the book's ``In [7]`` and ``In [8]``,
    and the speed-up; return rows (the test accuracies are ``accuracy_cells``).

    Parameters
    ----------
    devices : list of mxnet.Context
        The two devices of the 2-device runs: on simulated devices the speed-up row says why
        none is expected.
    records : list of dict
        The record's lines (``read_records``); those with the book's settings, no
        warmup and these data limits make the rows.
    """
    rows, seconds, book_sec = [], {}, {}
    for n in (1, 2):
        book = BOOK['training'][n]
        by_epoch = table_records(records, n, 0, train_limit, test_limit)
        setting = plural(n, 'device')
        book_sec[n] = float(np.mean(book['seconds']))
        head = (book['cell'], 'sec/epoch (mean), %s' % setting, '%.1f' % book_sec[n])
        per_epoch = [r['seconds'] for rs in by_epoch.values() for r in rs]
        if not per_epoch:
            rows.append(_row(*head, *_NOT_RUN))
            continue
        seconds[n] = float(np.mean(per_epoch))
        names = ', '.join(by_epoch[min(by_epoch)][0].get('device_names', []))
        rows.append(_row(*head, '%.1f on %s (%s)' % (seconds[n], names,
                                                     plural(len(per_epoch), 'epoch')),
                         'x%.2f' % (seconds[n] / book_sec[n]),
                         'not comparable: depends on the hardware (the speed-up is)',
                         'not comparable'))

    book_speedup = book_sec[1] / book_sec[2]
    newer = BOOK['newer_edition']
    head = ('In [7]/[8]', 'speed-up, 2 devices', '%.2fx (PyTorch ed. %.2fx)' % (
        book_speedup, newer[1]['sec_per_epoch'] / newer[2]['sec_per_epoch']))
    why = ('%s are simulated devices: they share the same CPU cores, which one device already '
           'keeps busy, and add copies and a gradient reduction, so no speed-up is expected'
           % ', '.join(str(d) for d in devices)) if is_simulated(devices) else None
    if len(seconds) < 2:
        verdict = 'not run (benchmarks/book_table.py)' + ('; ' + why if why else '')
        return rows + [_row(*head, 'not run', '', verdict, 'not run')]
    speedup = seconds[1] / seconds[2]
    ratio = speedup / book_speedup
    if why:
        verdict, status = 'not comparable: ' + why, 'not comparable'
    else:
        ok = SPEEDUP_BAND[0] <= ratio <= SPEEDUP_BAND[1]
        verdict = '%s (ours / book within %.2f to %.2f)' % (
            'within band' if ok else 'OUTSIDE band', *SPEEDUP_BAND)
        status = 'match' if ok else 'mismatch'
    return rows + [_row(*head, '%.2fx (%.1f / %.1f s)' % (speedup, seconds[1], seconds[2]),
                        'ours / book %.2f' % ratio, verdict, status)]


_COLUMNS = (('cell', 'cell'), ('what', 'what'), ('book', "book's value"), ('ours', 'ours'),
            ('diff', 'difference'), ('verdict', 'verdict'))


def _table(rows):
    return [[title for _, title in _COLUMNS]] + [[str(r[key]) for key, _ in _COLUMNS]
                                                 for r in rows]


def format_table(rows):
    """Format rows as a plain-text table, one line per row."""
    return format_table_lines(_table(rows))


def notes():
    """Return the lines that say how each kind of row is judged."""
    newer = BOOK['newer_edition']
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
        'test_acc: the book\'s measure (device 0\'s parameters and running statistics, '
        'evaluate_accuracy(test_iter, net, ctx[0])); ours is the mean over seeds with '
        'lowest-highest, beside the published GPU runs of the same code and of the later MXNet '
        'editions (docs/book-gpu-runs.md). With %d seeds or more a cell is judged: our mean, '
        'printed to two digits as the runs are, must lie in the same-code runs\' range, and '
        'at the last epoch within 0.01 of their median.' % MIN_SEEDS,
        'sec/epoch: depends on the hardware, shown only. The speed-up (mean seconds per epoch '
        'on 1 device over 2 devices) is judged: ours / book within %.2f to %.2f.' % SPEEDUP_BAND,
        'PyTorch ed.: the newer edition prints %.1f and %.1f s per epoch on 1 and 2 GPUs '
        '(10 epochs, test acc %.2f and %.2f).' % (newer[1]['sec_per_epoch'],
                                                  newer[2]['sec_per_epoch'],
                                                  newer[1]['test_acc'], newer[2]['test_acc']),
    ]


def describe_devices(devices):
    """One line: the book's devices and ours."""
    return 'devices: the book %s; ours %s%s' % (
        format_devices(BOOK['devices']), format_devices(devices),
        ', simulated on the CPU (no GPU used)' if is_simulated(devices) else '')


def child_env():
    """This environment, with the repository first on ``PYTHONPATH`` (for a child process)."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (ROOT, os.environ.get('PYTHONPATH')) if p))


PROG = 'python -m gluon_mgpu.compare'


def build_parser():
    p = cli.Parser(prog=PROG, description='Re-run the chapter\'s cells and its train, and print '
                   'a table: the book\'s printed values, ours, the difference, a verdict; then '
                   'the book\'s accuracy table beside the published GPU runs and the recorded '
                   'runs of this package (benchmarks/book_table.py trains them).')
    p.add_argument('--record', default=DEFAULT_RECORD, metavar='PATH',
                   help='the record of the full runs, one JSON line per epoch (default: '
                        'docs/book-table.jsonl in the repository)')
    cli.add_device_flag(p)
    p.add_argument('--data-dir', metavar='DIR',
                   help='the folder of the four Fashion-MNIST files (default: searched; '
                        'docs/testing.md)')
    cli.add_debug_flag(p)
    return p


def main(argv=None):
    """Entry point of ``python -m gluon_mgpu.compare``; returns the exit code: 1 when a row of
    the port is a mismatch (the accuracy table's verdicts are measurements), 2 for bad input."""
    argv = sys.argv[1:] if argv is None else list(argv)
    return cli.run_command(PROG, argv, lambda: _compare(build_parser().parse_args(argv)),
                           explain=_explain_failure)


def _explain_failure(e):
    if isinstance(e, RecordError):
        return 2, cli.error_line(PROG, e)
    return None


def _compare(args):
    from ..data import DataError, DataNotFoundError, find_data_dir
    from ..devices import get_devices
    records = read_records(args.record)
    try:
        runs = read_gpu_runs()
    except (OSError, ValueError) as e:
        raise RecordError('the GPU runs %s cannot be read: %s; restore the file from the '
                          'repository' % (GPU_RUNS, e)) from None
    try:
        pair = get_devices(2, args.device)
    except ValueError as e:
        raise cli.UsageError('--device %s: %s' % (args.device, e)) from None
    try:
        find_data_dir(args.data_dir)
    except (DataError, DataNotFoundError) as e:
        raise cli.UsageError(str(e)) from None
    rows = deterministic_rows(chapter_cells(pair))
    rows.append(step_row(pair, args.data_dir))
    rows += training_rows(pair, records)
    print(describe_devices(pair))
    print(format_table(rows))
    print()
    print(format_table_lines(format_accuracy_cells(accuracy_cells(records, runs))))
    print()
    for line in notes():
        print('note:', line)
    return 1 if any(r['status'] == 'mismatch' for r in rows) else 0


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


def format_table_lines(lines):
    """Format lists of cell texts (the first the titles) as a plain-text table."""
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]) - 1)]
    rule = ['-' * w for w in widths] + ['-' * len(lines[0][-1])]
    return '\n'.join(('  '.join(c.ljust(w) for c, w in zip(line, widths)) + '  '
                      + line[-1]).rstrip() for line in [lines[0], rule] + lines[1:])
