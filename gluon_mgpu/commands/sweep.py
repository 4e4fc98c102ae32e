"""The chapter's exercise: ``python -m gluon_mgpu.sweep --num-gpus 1 2 4`` trains ResNet-18 once
per device count, batch size and learning rate growing with the devices, and writes a table and a
figure; only ``main`` prints (docs/outputs.md, "The sweep").
"""
import os
import stat
import sys

from .. import devices as devices_mod
from . import cli
from ..assembly import runs
from ..runtime import files, startup
from ..runtime.checks import check_whole

PROG = 'python -m gluon_mgpu.sweep'
TABLE_FILE, PLOT_FILE = 'sweep.md', 'sweep.png'


def plan_sweep(num_gpus, batch_size_per_device=cli.BOOK_PER_DEVICE[0],
               lr_per_device=cli.BOOK_PER_DEVICE[1], device='auto'):
    """Resolve every device count (each at least 1 and each once, e.g. ``[1, 2, 4]``) to its
    devices (``get_devices(n, device)``; only the largest count warns), global batch size and
    learning rate (the per-device values times ``n``, the book's scaling) before any training.

    Returns
    -------
    list of dict
        One per count: ``num_devices``, ``devices`` (contexts), ``batch_size``, ``lr``.

    Raises
    ------
    ValueError
        For an empty list, a count below 1, a repeated count, or a count the machine cannot give.
    """
    counts = list(num_gpus)
    if not counts:
        raise ValueError('num_gpus is empty; pass device counts such as [1, 2, 4]')
    for n in counts:
        check_whole('every device count', n, 'for example [1, 2, 4]')
    repeated = sorted({n for n in counts if counts.count(n) > 1})
    if repeated:
        raise ValueError('device count %d is listed more than once; list each count once, '
                         'for example [1, 2, 4]' % repeated[0])
    # The largest count first: it is the one a machine may not give.
    resolved = {n: devices_mod.get_devices(n, device, warn=n == max(counts))
                for n in sorted(counts, reverse=True)}
    return [{'num_devices': n, 'devices': resolved[n], 'batch_size': batch_size_per_device * n,
             'lr': lr_per_device * n} for n in counts]


def run_setting(args, setting, handlers=()):
    """Train a fresh ResNet-18 for one ``plan_sweep`` setting with the sweep's flags ``args``, by
    the train command's own ``runs.run`` (``handlers`` after its own); return its row of the table.

    Returns
    -------
    dict
        ``num_devices``, ``devices`` (as text), ``batch_size``, ``lr``, ``epochs``,
        ``train_images``, ``test_images``, ``timed_epochs`` (epoch 2 on, or the only one) with
        their ``sec_per_epoch`` and ``images_per_sec``, ``test_acc``, ``cpu`` (all devices are
        CPU contexts), ``line`` (the summary line) and ``history``.
    """
    from ..handlers import metrics
    n, devices = setting['num_devices'], setting['devices']
    history, train_iter, test_iter = runs.run(runs.Run(
        num_gpus=n, device=args.device, batch_size=setting['batch_size'], lr=setting['lr'],
        epochs=args.epochs, data_dir=args.data_dir, train_limit=args.train_limit,
        test_limit=args.test_limit, seed=args.seed, hybridize=args.hybridize, dtype=args.dtype,
        force_dtype=args.force_dtype, label=devices_mod.plural(n, 'device') + ', ',
        devices=devices, most_devices=max(args.num_gpus)), PROG, handlers)
    summary = metrics.summarize(history, devices)
    # Epoch 1 also pays one-time set-up (graph building, memory allocation): time the later
    # epochs when there are any.
    timed_epochs = history[1:] or history
    timed = metrics.summarize(timed_epochs, devices)
    return dict(setting, devices=[str(d) for d in devices], epochs=args.epochs,
                train_images=train_iter.num_examples, test_images=test_iter.num_examples,
                timed_epochs=[r['epoch'] for r in timed_epochs],
                sec_per_epoch=timed['sec_per_epoch'], images_per_sec=timed['images_per_sec'],
                test_acc=summary['test_acc'], cpu=all(d.device_type == 'cpu' for d in devices),
                line=summary['line'], history=history)


def add_speedups(rows):
    """Set every row's ``speedup``: its images/s over the 1-device row's (None without one)."""
    base = [r['images_per_sec'] for r in rows if r['num_devices'] == 1]
    for r in rows:
        r['speedup'] = r['images_per_sec'] / base[0] if base else None
    return rows


def format_table(rows, stopped=None):
    """Return the sweep as Markdown: one line saying what ran, the table, and notes (one says
    that only the finished settings are listed if ``stopped``, why the sweep ended early)."""
    first = rows[0]
    per_device = first['batch_size'] // first['num_devices']
    lines = ['ResNet-18 on Fashion-MNIST (%d training, %d test images), %d epoch%s, batch %d '
             'and lr %g per device.' % (first['train_images'], first['test_images'],
                                        first['epochs'], '' if first['epochs'] == 1 else 's',
                                        per_device, first['lr'] / first['num_devices']),
             '',
             '| devices | global batch | lr | sec/epoch | images/s | speed-up over 1 device '
             '| final test acc |',
             '| --- | ---: | ---: | ---: | ---: | ---: | ---: |']
    for r in rows:
        lines.append('| %d: [%s] | %d | %g | %.1f | %.1f | %s | %.2f |' % (
            r['num_devices'], ', '.join(r['devices']), r['batch_size'], r['lr'],
            r['sec_per_epoch'], r['images_per_sec'],
            'n/a' if r.get('speedup') is None else '%.2f' % r['speedup'], r['test_acc']))
    notes = [] if stopped is None else [
        'The sweep stopped early (%s): only the settings that finished are listed.' % stopped]
    setup = 'also pays one-time set-up (graph building, memory allocation)'
    notes += ['sec/epoch is the mean training time per epoch (test evaluation not included) '
              'and images/s counts training images, both %s.' % (
                  'from epoch 2 on: epoch 1 %s' % setup if first['epochs'] > 1 else
                  'in the only epoch, which %s: run 2 epochs or more to leave it out' % setup)]
    if all(r.get('speedup') is None for r in rows):
        notes.append('There is no 1-device setting, so no speed-up is given; add 1 to '
                     '--num-gpus.')
    if any(r['cpu'] for r in rows):
        notes.append('These devices are CPU contexts sharing one machine\'s cores (no GPU was '
                     'used): the data parallelism is real, but a speed-up is not expected here. '
                     'Run the sweep on GPUs to measure scaling.')
    lines += [''] + ['Note: %s' % n for n in notes]
    return '\n'.join(lines) + '\n'


def write_outputs(rows, output_dir, stopped=None):
    """Write ``sweep.md`` and ``sweep.png`` into ``output_dir``; return the paths written."""
    from ..handlers import plotting
    table_path = os.path.join(output_dir, TABLE_FILE)
    with files.atomic_path(table_path) as tmp:
        with open(tmp, 'w') as f:
            f.write(format_table(rows, stopped))
    title = 'ResNet-18 on Fashion-MNIST, data-parallel on %s devices' % ', '.join(
        str(r['num_devices']) for r in rows)
    if any(r['cpu'] for r in rows):
        title += ' (CPU contexts sharing one machine: no speed-up expected)'
    plot_path = os.path.join(output_dir, PLOT_FILE)
    return [table_path] + plotting.plot_sweep(rows, plot_path, title=title)


def build_parser():
    p = cli.Parser(prog=PROG, description='Train the chapter\'s ResNet-18 once per device count '
                   'and compare time, throughput and accuracy in a Markdown table and a figure.')
    p.add_argument('--num-gpus', type=cli.Parser.whole('--num-gpus'), nargs='+', required=True,
                   metavar='N', help='device counts to compare, e.g. 1 2 4')
    p.add_argument('--batch-size-per-device', type=cli.Parser.whole('--batch-size-per-device'),
                   default=cli.BOOK_PER_DEVICE[0],
                   help='batch size per device; the global batch is this times the device '
                        'count (default: %d, as the book)' % cli.BOOK_PER_DEVICE[0])
    p.add_argument('--lr-per-device', type=cli.Parser.learning_rate('--lr-per-device'),
                   default=cli.BOOK_PER_DEVICE[1],
                   help='learning rate per device; the run uses this times the device count '
                        '(default: %g, as the book)' % cli.BOOK_PER_DEVICE[1])
    p.add_argument('--epochs', type=cli.Parser.whole('--epochs'), default=4,
                   help='epochs per setting (default: 4)')
    p.add_device_flag()
    p.add_data_flags()
    p.add_seed_flag('seed for every setting\'s initialization and data order (default: '
                    'none)')
    p.add_hybridize_flag()
    p.add_dtype_flags()
    p.add_argument('--output-dir', default='sweep-results', metavar='DIR',
                   type=cli.Parser.output_folder('--output-dir', 'sweep-results', mxnet=False),
                   help='folder for %s and %s, created if missing (default: sweep-results)'
                        % (TABLE_FILE, PLOT_FILE))
    p.add_debug_flag()
    return p


def _prepare_output_dir(path, locks):
    """Make folder ``path`` and lock its outputs (into ``locks``: one sweep writes them), or
    refuse it before any setting trains."""
    kind = files.non_folder_kind(path)
    if kind:
        raise cli.UsageError('--output-dir %s is %s, not a folder; choose a folder' % (path, kind))
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise cli.UsageError('--output-dir %s: cannot create the folder (%s); choose another '
                             'folder' % (path, e.strerror or e)) from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise cli.UsageError('--output-dir %s: the folder is not writable; choose another '
                             'folder' % path)
    for name in (TABLE_FILE, PLOT_FILE):  # found now, not after every setting has trained
        target = os.path.join(path, name)
        problem = files.name_problem(target)
        if problem:
            raise cli.UsageError('--output-dir %s: %s: %s' % (path, target, problem))
        try:
            locks.append(files.lock_file(target))
        except (OSError, ValueError) as e:
            raise cli.UsageError('--output-dir %s: %s' % (path, e)) from None
        try:
            mode = os.lstat(target).st_mode
        except OSError:
            continue
        if not stat.S_ISREG(mode):
            raise cli.UsageError('--output-dir %s holds %s, which is %s, not a regular file, and '
                                 'the sweep writes that name; move it away or choose another '
                                 'folder' % (path, target, files.file_kind(mode)))


def _run(args, state):
    """Plan, train every setting and write the results. ``state['rows']`` collects the
    finished rows, ``state['setting']`` is the one under way (else None), for the error line."""
    flags = '--num-gpus %s --device %s' % (' '.join(map(str, args.num_gpus)), args.device)
    try:
        settings = plan_sweep(args.num_gpus, args.batch_size_per_device, args.lr_per_device,
                              args.device)
    except ValueError as e:
        raise cli.UsageError('%s: %s' % (flags, e)) from None
    top = max(settings, key=lambda s: s['num_devices'])
    if top['lr'] > cli.LR_RANGE[1]:  # found now, not when that setting starts
        raise cli.UsageError('--lr-per-device %g times %d devices is %g, more than MXNet\'s '
                             'float32 optimizer can use (%.8g); pass --lr-per-device %g or less'
                             % (args.lr_per_device, top['num_devices'], top['lr'],
                                cli.LR_RANGE[1], cli.LR_RANGE[1] / top['num_devices']))
    if args.train_limit is not None and args.train_limit < top['num_devices']:
        raise cli.UsageError('--train-limit %d gives fewer training images than the %d devices '
                             'of the largest setting, so some device would get no data; pass '
                             '--train-limit %d or more' % (args.train_limit, top['num_devices'],
                                                           top['num_devices']))
    runs.check_memory(top['devices'], 'resnet18', flags)
    runs.check_dtype(PROG, args.dtype, top['devices'], args.force_dtype)
    _prepare_output_dir(args.output_dir, state['locks'])
    rows = state['rows']
    for s in settings:
        state['setting'] = s
        # The DeferredInterrupt raises a Ctrl-C noted inside a __del__, after the step.
        rows.append(run_setting(args, s, [state['interrupt']]))
    state['setting'] = None
    add_speedups(rows)
    print()
    print(format_table(rows), end='')
    paths = write_outputs(rows, args.output_dir)
    print('\nwrote %s' % ', '.join(paths), flush=True)
    return rows


def _where(state):
    if state['setting'] is not None:
        return ' in the %d-device setting' % state['setting']['num_devices']
    return ' after the last setting' if state['rows'] else ' before training started'


def _device_counts(rows):
    counts = [str(r['num_devices']) for r in rows]
    text = counts[0] if len(counts) == 1 else '%s and %s' % (', '.join(counts[:-1]), counts[-1])
    return '%s device%s' % (text, '' if counts == ['1'] else 's')


def _keep_finished(args, state, why):
    """After a failure in a setting, print and write the finished rows; return the clause of
    the error line that says so ('' before the first setting; after the last, the table is
    printed already). ``why`` None: bad input, which loses nothing when no row finished."""
    rows = state['rows']
    if state['setting'] is None:
        return ' (the table is printed above)' if rows and why else ''
    if not rows:
        return '' if why is None else '; no setting had finished, so nothing was written'
    stopped = '%s%s' % (why or 'an error', _where(state))
    add_speedups(rows)
    print()
    print(format_table(rows, stopped), end='', flush=True)
    try:
        paths = write_outputs(rows, args.output_dir, stopped)
    except Exception as e:
        return '; the finished settings (%s) could not be written: %s: %s' % (
            _device_counts(rows), type(e).__name__, cli.one_line(e))
    return '; the finished settings (%s) are in %s' % (_device_counts(rows), ', '.join(paths))


def main(argv=None):
    """Entry point of ``python -m gluon_mgpu.sweep``; returns the exit code (docs/outputs.md).
    Settings that finished before a failure are printed and written all the same."""
    entry = argv is None
    argv = sys.argv[1:] if argv is None else list(argv)
    args, state = None, {'rows': [], 'setting': None, 'locks': []}

    def body():
        nonlocal args
        args = build_parser().parse_args(argv)  # no MXNet yet: a bad flag is answered at once
        startup.before_mxnet(PROG)  # threads, checks, then MXNet
        from ..handlers.interrupts import DeferredInterrupt
        with DeferredInterrupt() as interrupt:
            state['interrupt'] = interrupt
            _run(args, state)

    def story(e):  # what cli.failure's line adds for this command: the finished settings
        if args is None:
            return {}
        return {'saved': lambda e, why: _keep_finished(args, state, why), 'where': _where(state),
                'lr': ('--lr-per-device', args.lr_per_device),
                'batch': ('--batch-size-per-device', args.batch_size_per_device)}

    def release():  # the locks, held while the finished settings are written
        for lock in state['locks']:
            lock.release()
        state['locks'] = []
        return True

    # After memory ran out MXNet's exit may crash: the process leaves at once, locks released.
    code = cli.run_command(PROG, argv, body, story,
                           lambda e: entry and cli.out_of_memory(e) and release())
    release()
    return code
