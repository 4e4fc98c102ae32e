"""The book's printed outputs next to ours: ``python -m gluon_mgpu.compare``.

The chapter prints two things that do not depend on the hardware's speed: ``Out[4]``, the
network's outputs for a random (4, 1, 28, 28) batch split over two devices, and ``Out[5]``,
the first convolution's weights on both devices. Both come from MXNet's default random seed:
in a fresh process, with no random number drawn before the chapter's cells, the same calls in
the same order give the same numbers. The weights come out equal to every printed digit (they
are drawn on the CPU, even when the devices are GPUs); the outputs agree to about six
significant digits (another machine sums in another order).

The chapter also prints its training runs (``In [7]``, ``In [8]``): the test accuracy after
each epoch and the seconds per epoch on one and on two GPUs. Those rows are filled only by a
real run (``--full``: the book's settings, the full data set); otherwise they say "not run".

Library functions return rows (dicts); only ``main`` prints. The command exits with 0 when
no row is a mismatch, 1 when one is, 2 on bad input (one line on stderr).
"""
import datetime
import json
import os
import re
import subprocess
import sys

import numpy as np

from . import book, cli
from .cli import UsageError

__all__ = ['BOOK', 'OUT4_RTOL', 'ACC_BAND', 'ACC_BAND_FIRST_EPOCH', 'SPEEDUP_BAND',
           'printed_numbers', 'format_like_book', 'run_chapter_cells', 'chapter_cells',
           'deterministic_rows', 'train_book_setting', 'training_rows', 'is_simulated',
           'notes', 'describe_devices', 'format_table', 'format_markdown', 'main']

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
# One run of the book is one draw: the test accuracy of another run with other random
# initial weights and another data order lands near it, not on it. The first epoch swings most.
ACC_BAND = 0.05
ACC_BAND_FIRST_EPOCH = 0.10
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
    """Run the chapter's ``In [2]`` to ``In [5]`` in this process on two ``devices``.

    The values equal the book's only in a fresh random state: call this before any other
    MXNet random number is drawn in the process (``chapter_cells`` does it in a new process).

    Parameters
    ----------
    devices : list of mxnet.Context
        Two devices, for example ``[mx.gpu(0), mx.gpu(1)]`` or ``[mx.cpu(0), mx.cpu(1)]``.

    Returns
    -------
    dict
        ``devices`` (their names), ``outputs`` (one 2x10 list per device, ``Out[4]``),
        ``weights`` (``weight.data(device)[0]`` per device, ``Out[5]``), ``default_read``
        (what ``weight.data()`` without a device did: ``{'raised': bool, 'printed': str}``)
        and ``mxnet_version``.
    """
    import mxnet as mx
    from mxnet import init, nd
    from mxnet.gluon import utils as gutils

    from .model import resnet18

    if len(devices) != 2:
        raise ValueError('the chapter splits its batch over 2 devices, got %d (%s); pass two '
                         'contexts' % (len(devices), devices))
    net = resnet18(10)
    net.initialize(init=init.Normal(sigma=book.INIT_SIGMA), ctx=devices)
    x = nd.random.uniform(shape=(4, 1, 28, 28))
    shards = gutils.split_and_load(x, devices)
    outputs = [net(shards[0]), net(shards[1])]
    weight = net[0].params.get('weight')
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


def _context(name):
    kind, index = re.fullmatch(r'(cpu|gpu)\((\d+)\)', name).groups()
    import mxnet as mx
    return mx.Context(kind, int(index))


def _cells_child(names):
    """Entry point of the fresh process started by ``chapter_cells``: print the cells as JSON."""
    import gluon_mgpu  # noqa: F401  (sets the thread count before MXNet starts)
    cells = run_chapter_cells([_context(n) for n in names.split(',')])
    print(json.dumps(cells))


def chapter_cells(devices, fresh_process=True):
    """Run the chapter's deterministic cells and return what ``run_chapter_cells`` returns.

    Parameters
    ----------
    devices : list of mxnet.Context
        Two devices (see ``gluon_mgpu.get_devices(2)``).
    fresh_process : bool, default True
        Run them in a new Python process, whose MXNet random state is the default one, so the
        result does not depend on what this process did before. ``False`` runs them here.

    Raises
    ------
    RuntimeError
        If the new process fails; the message holds the end of its error output.
    """
    if not fresh_process:
        return run_chapter_cells(devices)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ)
    env['PYTHONPATH'] = os.pathsep.join(p for p in (root, env.get('PYTHONPATH')) if p)
    code = 'import sys; from gluon_mgpu.compare import _cells_child; _cells_child(sys.argv[1])'
    result = subprocess.run([sys.executable, '-c', code, ','.join(str(d) for d in devices)],
                            capture_output=True, text=True, env=env, timeout=600)
    if result.returncode != 0:
        raise RuntimeError('running the chapter\'s cells in a new process failed (exit %d): %s'
                           % (result.returncode, result.stderr.strip()[-2000:]))
    return json.loads(result.stdout.splitlines()[-1])


def is_simulated(devices):
    """True when several devices are all CPU contexts: they share one CPU's cores."""
    names = [str(d) for d in devices]
    return len(names) > 1 and all(n.startswith('cpu') for n in names)


def _abbrev(values, fmt):
    flat = np.asarray(values, dtype=np.float64).ravel()
    shape = 'x'.join(str(s) for s in np.shape(values))
    return '%s: %s ... %s' % (shape, fmt(flat[0]), fmt(flat[-1]))


def _row(cell, what, book, ours, diff, verdict, status):
    return {'cell': cell, 'what': what, 'book': book, 'ours': ours, 'diff': diff,
            'verdict': verdict, 'status': status}


def deterministic_rows(cells):
    """Compare ``Out[4]``, the ``In [5]`` print and ``Out[5]`` with the book; return rows.

    Each row is a dict: ``cell``, ``what``, ``book``, ``ours``, ``diff``, ``verdict`` (text)
    and ``status``: ``'match'``, ``'mismatch'`` or ``'explained'`` (differs for a stated
    reason that is not an error).
    """
    rows = []
    devices = cells['devices']
    for i, (text, ours) in enumerate(zip(BOOK['out4'], cells['outputs'])):
        book = np.array([float(v) for v in printed_numbers(text)]).reshape(2, 10)
        ours = np.asarray(ours, dtype=np.float64)
        rel = np.abs(ours - book) / np.abs(book)
        ok = ours.shape == book.shape and bool(np.all(rel <= OUT4_RTOL))
        rows.append(_row(
            'Out[4]', 'net(x), device %d' % i,
            _abbrev(book, lambda v: '%.7e' % v), _abbrev(ours, lambda v: '%.7e' % v),
            'max rel %.1e' % rel.max(),
            ('match (rtol %.0e per element)' if ok else 'MISMATCH (rtol %.0e per element)')
            % OUT4_RTOL, 'match' if ok else 'mismatch'))

    read = cells['default_read']
    if read['raised']:
        ok = read['printed'] == BOOK['not_initialized']
        rows.append(_row('In [5]', 'weight.data(), no device', BOOK['not_initialized'],
                         read['printed'], 'none' if ok else 'text differs',
                         'match' if ok else 'MISMATCH', 'match' if ok else 'mismatch'))
    else:
        rows.append(_row(
            'In [5]', 'weight.data(), no device', BOOK['not_initialized'],
            read['printed'], 'no error',
            'explained: the default device cpu(0) is one of ours (%s), so it holds a replica; '
            'on GPUs the book\'s line appears' % ', '.join(devices), 'explained'))

    book_tokens = printed_numbers(BOOK['out5'])
    book = np.array([float(v) for v in book_tokens]).reshape(1, 3, 3)
    for i, ours in enumerate(cells['weights']):
        ours_text = format_like_book(ours)
        ours_tokens = printed_numbers(ours_text)
        same = sum(a == b for a, b in zip(book_tokens, ours_tokens))
        ok = len(ours_tokens) == len(book_tokens) == same
        rows.append(_row(
            'Out[5]', 'first conv weight, device %d' % i,
            _abbrev(book, lambda v: '%.8f' % v), _abbrev(ours, lambda v: '%.8f' % v),
            '%d/%d printed equal' % (same, len(book_tokens)),
            'match (every printed digit)' if ok else 'MISMATCH (printed digits differ)',
            'match' if ok else 'mismatch'))
    first, second = (np.asarray(w) for w in cells['weights'])
    ok = np.array_equal(first, second)
    rows.append(_row('Out[5]', 'device 0 vs device 1', 'identical',
                     'identical' if ok else 'differ', 'max abs %.1e' % np.abs(first - second).max(),
                     'match' if ok else 'MISMATCH', 'match' if ok else 'mismatch'))
    return rows


def train_book_setting(devices, data_dir=None, num_epochs=4, train_limit=None, test_limit=None):
    """Train a new ResNet-18 as the book's ``train(num_gpus, batch_size, lr)`` does; return its history.

    The book's setting for ``n = len(devices)`` (``book.book_setting``): a global batch of
    ``256 * n``, ``lr = 0.1 * n``, 4 epochs, the full data set, imperative (not hybridized) like
    the book. The limits make a small run for tests. Prints the book's per-epoch lines.
    """
    from .data import load_data_fashion_mnist
    from .training import train

    batch_size, lr = book.book_setting(len(devices))
    train_iter, test_iter = load_data_fashion_mnist(batch_size, data_dir=data_dir,
                                                    train_limit=train_limit,
                                                    test_limit=test_limit)
    return train(book.new_network('resnet18', hybridize=False), train_iter, test_iter, devices,
                 lr=lr, num_epochs=num_epochs)


def training_rows(devices, runs=None):
    """Compare training runs with the book's ``In [7]`` and ``In [8]``; return rows.

    Parameters
    ----------
    devices : list of mxnet.Context
        The two devices of the 2-device run (done or not): on simulated devices the speed-up
        row says why none is expected.
    runs : dict, optional
        ``{1: (devices, history), 2: (devices, history)}``, histories from
        ``train_book_setting``; a missing run, or a missing epoch, gives rows that say
        "not run".

    Notes
    -----
    Accuracy must lie within ``ACC_BAND`` of the book's (``ACC_BAND_FIRST_EPOCH`` for epoch 1).
    Seconds depend on the hardware and are shown, not judged; the speed-up (mean seconds per
    epoch on 1 device over 2 devices, measured in one run) is judged as a ratio to the book's.
    """
    runs = runs or {}
    rows = []
    for n in (1, 2):
        book = BOOK['training'][n]
        run_devices, history = runs.get(n, (None, []))
        setting = '%d device%s' % (n, 's' if n > 1 else '')
        for e, book_acc in enumerate(book['test_acc'], 1):
            what = 'test_acc epoch %d, %s' % (e, setting)
            if e > len(history):
                rows.append(_row(book['cell'], what, '%.2f' % book_acc, 'not run', '',
                                 'not run (pass --full)', 'not run'))
                continue
            ours = history[e - 1]['test_acc']
            band = ACC_BAND_FIRST_EPOCH if e == 1 else ACC_BAND
            ok = abs(ours - book_acc) <= band + 1e-9
            rows.append(_row(book['cell'], what, '%.2f' % book_acc, '%.2f' % ours,
                             '%+.2f' % (ours - book_acc),
                             '%s (+-%.2f)' % ('within band' if ok else 'OUTSIDE band', band),
                             'match' if ok else 'mismatch'))
        book_sec = float(np.mean(book['seconds']))
        if len(history) == len(book['seconds']):
            ours_sec = float(np.mean([r['seconds'] for r in history]))
            rows.append(_row(book['cell'], 'sec/epoch (mean), %s' % setting,
                             '%.1f' % book_sec, '%.1f on %s' % (ours_sec, ', '.join(
                                 str(d) for d in run_devices)), 'x%.2f' % (ours_sec / book_sec),
                             'not comparable: depends on the hardware (the speed-up is)',
                             'not comparable'))
        else:
            rows.append(_row(book['cell'], 'sec/epoch (mean), %s' % setting,
                             '%.1f' % book_sec, 'not run', '', 'not run (pass --full)',
                             'not run'))

    book_sec = [float(np.mean(BOOK['training'][n]['seconds'])) for n in (1, 2)]
    book_speedup = book_sec[0] / book_sec[1]
    newer = BOOK['newer_edition']
    book_text = '%.2fx (PyTorch ed. %.2fx)' % (
        book_speedup, newer[1]['sec_per_epoch'] / newer[2]['sec_per_epoch'])
    what = 'speed-up, 2 devices'
    done = all(len(runs.get(n, (None, []))[1]) == 4 for n in (1, 2))
    simulated = is_simulated(devices)
    why = ('%s are simulated devices: they share the same CPU cores, which one device already '
           'keeps busy, and add copies and a gradient reduction, so no speed-up is expected'
           % ', '.join(str(d) for d in devices))
    if not done:
        verdict = 'not run (pass --full)' + ('; ' + why if simulated else '')
        rows.append(_row('In [7]/[8]', what, book_text, 'not run', '', verdict, 'not run'))
        return rows
    ours_sec = [float(np.mean([r['seconds'] for r in runs[n][1]])) for n in (1, 2)]
    speedup = ours_sec[0] / ours_sec[1]
    ratio = speedup / book_speedup
    if simulated:
        verdict, status = 'not comparable: ' + why, 'not comparable'
    else:
        ok = SPEEDUP_BAND[0] <= ratio <= SPEEDUP_BAND[1]
        verdict = '%s (ours / book within %.2f to %.2f)' % (
            'within band' if ok else 'OUTSIDE band', *SPEEDUP_BAND)
        status = 'match' if ok else 'mismatch'
    rows.append(_row('In [7]/[8]', what, book_text,
                     '%.2fx (%.1f / %.1f s)' % (speedup, ours_sec[0], ours_sec[1]),
                     'ours / book %.2f' % ratio, verdict, status))
    return rows


_COLUMNS = (('cell', 'cell'), ('what', 'what'), ('book', "book's value"), ('ours', 'ours'),
            ('diff', 'difference'), ('verdict', 'verdict'))


def format_table(rows):
    """Format rows as a plain-text table, one line per row."""
    head = [title for _, title in _COLUMNS]
    body = [[str(r[key]) for key, _ in _COLUMNS] for r in rows]
    widths = [max(len(line[i]) for line in [head] + body) for i in range(len(head) - 1)]
    lines = []
    for line in [head, ['-' * w for w in widths] + ['-' * len(head[-1])]] + body:
        lines.append('  '.join(c.ljust(w) for c, w in zip(line, widths)) + '  ' + line[-1])
    return '\n'.join(l.rstrip() for l in lines)


def notes():
    """Return the lines that say how each kind of row is judged."""
    newer = BOOK['newer_edition']
    return [
        'Out[4], Out[5]: the chapter\'s cells re-run in a new process, so from MXNet\'s default '
        'random seed and in the book\'s order; Out[4] must agree within rtol %.0e per element '
        '(another machine sums in another order), Out[5] to every printed digit (the weights '
        'are drawn on the CPU, also when the devices are GPUs).' % OUT4_RTOL,
        'test_acc: within +-%.2f of the book\'s (+-%.2f in epoch 1); one run of the book is one '
        'random draw.' % (ACC_BAND, ACC_BAND_FIRST_EPOCH),
        'sec/epoch: depends on the hardware, shown only. The speed-up (mean seconds per epoch '
        'on 1 device over 2 devices, both measured in one run) is judged: ours / book within '
        '%.2f to %.2f.' % SPEEDUP_BAND,
        'PyTorch ed.: the newer edition prints %.1f and %.1f s per epoch on 1 and 2 GPUs '
        '(10 epochs, test acc %.2f and %.2f).' % (newer[1]['sec_per_epoch'],
                                                  newer[2]['sec_per_epoch'],
                                                  newer[1]['test_acc'], newer[2]['test_acc']),
    ]


def describe_devices(devices):
    """One line: the book's devices and ours."""
    return 'devices: the book %s; ours %s%s' % (
        '[%s]' % ', '.join(BOOK['devices']), '[%s]' % ', '.join(str(d) for d in devices),
        ', simulated on the CPU (no GPU used)' if is_simulated(devices) else '')


def format_markdown(report):
    """Format a report as the page ``docs/book-comparison.md``.

    ``report`` holds ``rows``, ``cells`` (from ``chapter_cells``), ``full`` (bool),
    ``command``, ``date`` and ``mxnet_version``.
    """
    def cell(text):
        return str(text).replace('|', '\\|')

    cells = report['cells']
    lines = ['# The book, side by side', '',
             'Generated by `%s` on %s with MXNet %s; %s.'
             % (report['command'], report['date'], report['mxnet_version'],
                describe_devices(cells['devices'])), '']
    if report['full']:
        lines += ['The training rows come from the book\'s settings, run here in full.', '']
    else:
        lines += ['Run without `--full`: the chapter\'s deterministic cells were re-run, its '
                  'training was not (on 2 CPU cores it would take several hours), so those rows '
                  'say "not run". `python -m gluon_mgpu.compare --full` fills them.', '']
    lines += ['| ' + ' | '.join(title for _, title in _COLUMNS) + ' |',
              '|' + '---|' * len(_COLUMNS)]
    for r in report['rows']:
        lines.append('| ' + ' | '.join(cell(r[key]) for key, _ in _COLUMNS) + ' |')
    lines += [''] + ['- ' + n for n in notes()]
    lines += ['', '## The printed values in full', '']
    for i in range(2):
        lines += ['Out[4], device %d: the book (%s)' % (i, BOOK['devices'][i]), '', '```',
                  BOOK['out4'][i], '```', '', 'ours (%s)' % cells['devices'][i], '', '```',
                  format_like_book(cells['outputs'][i]), '```', '']
    lines += ['Out[5], both devices: the book', '', '```', BOOK['out5'], '```', '']
    for i in range(2):
        lines += ['ours (%s)' % cells['devices'][i], '', '```',
                  format_like_book(cells['weights'][i]), '```', '']
    return '\n'.join(lines).rstrip() + '\n'


PROG = 'python -m gluon_mgpu.compare'


def build_parser():
    p = cli.Parser(prog=PROG, description='Re-run the chapter\'s cells and print a table: the '
                   'book\'s printed values, ours, the difference, a verdict.')
    p.add_argument('--full', action='store_true',
                   help='also run the book\'s training (1 then 2 devices, 4 epochs, full data; '
                        'hours on a CPU) and compare accuracy and speed-up (default: off, those '
                        'rows say "not run")')
    cli.add_device_flag(p)
    p.add_argument('--data-dir', default=None,
                   help='folder with the Fashion-MNIST files, for --full (default: searched)')
    p.add_argument('--output', default=None, metavar='PATH',
                   help='also write the table as Markdown to PATH, e.g. '
                        'docs/book-comparison.md (default: print only)')
    cli.add_debug_flag(p)
    return p


def main(argv=None):
    """Entry point of ``python -m gluon_mgpu.compare``; returns the exit code."""
    argv = sys.argv[1:] if argv is None else list(argv)
    return cli.run_command(PROG, argv, lambda: _compare(argv, build_parser().parse_args(argv)))


def _compare(argv, args):
    from .data import DataError, DataNotFoundError, find_data_dir
    from .devices import format_devices, get_devices
    if args.output and not os.path.isdir(os.path.dirname(os.path.abspath(args.output))):
        raise UsageError('%s: error: --output %s: folder %s does not exist; create it or '
                         'pass another path' % (PROG, args.output,
                                                os.path.dirname(args.output)))
    try:
        pair = get_devices(2, args.device)
        singles = get_devices(1, args.device) if args.full else None
    except ValueError as e:
        raise UsageError('%s: error: --device %s: %s' % (PROG, args.device, e)) from None
    if args.full:
        try:
            find_data_dir(args.data_dir)
        except (DataError, DataNotFoundError) as e:
            raise UsageError('%s: error: %s' % (PROG, e)) from None

    cells = chapter_cells(pair)
    rows = deterministic_rows(cells)
    runs = {}
    if args.full:
        for devices in (singles, pair):
            print('running on:', format_devices(devices), flush=True)
            runs[len(devices)] = (devices, train_book_setting(devices, data_dir=args.data_dir))
    rows += training_rows(pair, runs)
    print(describe_devices(pair))
    print(format_table(rows))
    print()
    for line in notes():
        print('note:', line)
    if args.output:
        report = {'rows': rows, 'cells': cells, 'full': args.full,
                  'command': ' '.join([PROG] + argv),
                  'mxnet_version': cells['mxnet_version'], 'date': datetime.date.today().isoformat()}
        with open(args.output, 'w') as f:
            f.write(format_markdown(report))
        print('wrote', args.output)
    bad = [r for r in rows if r['status'] == 'mismatch']
    return 1 if bad else 0

if __name__ == '__main__':
    sys.exit(main())
