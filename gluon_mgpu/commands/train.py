"""``python -m gluon_mgpu.train --num-gpus 2``: flags into the arguments and event handlers of
``gluon_mgpu.train`` (docs/events.md); its outputs and exit codes are in docs/outputs.md, a dist
job's worker in docs/distributed.md.
"""
import argparse
import contextlib
import functools
import json
import os
import re
import secrets
import shlex
import sys

from . import cli
from ..assembly import runs
from ..assembly.runs import NOT_RECORDED as _NOT_RECORDED, OUTPUTS, Run, network_name
from ..runtime import files, startup
from ..runtime.choices import JOB_KVSTORES, KVSTORES, LOADERS, METHODS, MODELS
from .cli import Parser, UsageError

PROG = 'python -m gluon_mgpu.train'
PLOT_SUFFIXES = ('.png', '.svg')
# Settings that define a run: continuing with other values would be a different run.
RUN_SETTINGS = ('num_gpus', 'batch_size', 'seed', 'train_limit', 'test_limit', 'dtype',
                'warmup_steps')


@functools.lru_cache(maxsize=None)  # one parser: parsing never changes it
def build_parser():
    book_batch, book_lr = cli.BOOK_PER_DEVICE
    p = Parser(prog=PROG, description='Train the chapter\'s ResNet-18 on Fashion-MNIST '
               'with data parallelism over several devices (GPUs, or simulated CPU devices).')
    p.add_argument('--num-gpus', type=Parser.whole('--num-gpus'), default=1,
                   help='number of devices to train on (default: 1)')
    p.add_argument('--batch-size', type=Parser.whole('--batch-size'),
                   help='global batch size, split over the devices '
                        '(default: %d per device, as the book: %d for 1, %d for 2; in a '
                        'dist job, per device of all workers)'
                        % (book_batch, book_batch, 2 * book_batch))
    p.add_argument('--lr', type=Parser.learning_rate('--lr'),
                   help='SGD learning rate (default: %g per device, as the book: %g, %g)'
                        % (book_lr, book_lr, 2 * book_lr))
    p.add_argument('--epochs', type=Parser.whole('--epochs'), default=4,
                   help='number of epochs (default: 4)')
    p.add_device_flag()
    p.add_data_flags()
    p.add_hybridize_flag()
    p.add_dtype_flags()
    p.add_argument('--loader', choices=LOADERS, default='array',
                   help="array: the data set as one float32 array, batches by slicing; gluon: "
                        "the book's DataLoader with ToTensor per image (default: array)")
    p.add_seed_flag('seed for initialization and data order (default: none, a new run '
                    'each time; with --checkpoint-dir one is chosen and recorded)')
    p.add_argument('--checkpoint-dir', metavar='DIR', type=Parser.output_folder('--checkpoint-dir'),
                   help='save a checkpoint into DIR at the end of every epoch (default: none)')
    p.add_argument('--resume', action='store_true',
                   help='continue the run saved in --checkpoint-dir from its last checkpoint; '
                        'flags left out take the run\'s values')
    p.add_debug_flag()
    p.add_argument('--check-replicas', type=Parser.whole('--check-replicas'), metavar='N',
                   help='every N steps and after each epoch, check that the trained parameters '
                        'are identical on every device; print one summary line per epoch and '
                        'stop with exit code 1 on a mismatch (default: no check)')
    p.add_argument('--quiet', action='store_true',
                   help='print only the final summary line (warnings and errors still go to '
                        'stderr)')
    p.add_argument('--metrics-json', type=Parser.output_file('--metrics-json'), metavar='PATH',
                   help='write arguments, devices, per-epoch numbers and the summary to this '
                        'JSON file, rewritten after every epoch (docs/metrics-schema.md)')
    p.add_argument('--plot', metavar='PATH',
                   type=Parser.output_file('--plot', 'curves.png'),
                   help='draw test accuracy and training loss per epoch into this .png (an '
                        '.svg name writes the .svg and a .png beside it), redrawn every epoch')
    p.add_argument('--model', choices=MODELS, default='resnet18',
                   help="resnet18: the chapter's network; lenet: the book's LeNet, without "
                        'BatchNorm, whose result does not depend on how batches are split '
                        '(default: resnet18)')
    p.add_argument('--kvstore', choices=KVSTORES, default='device',
                   help='how gradients are summed: device (on the devices, the book\'s '
                        'Trainer default), local (on the CPU), dist_sync / dist_device_sync '
                        '(also over the workers of a job started by python -m '
                        'gluon_mgpu.launch), horovod (over the processes of a job started by '
                        'horovodrun); --batch-size is then the batch of all workers together '
                        '(default: device)')
    split = p.add_mutually_exclusive_group()
    split.add_argument('--device-weights', type=Parser.weights, metavar='W1,W2,...',
                       help='split every batch in proportion to these weights, one per '
                            'device, e.g. 3,1 for a device three times as fast (default: '
                            'even split)')
    split.add_argument('--balance', choices=('even', 'auto'), default='even',
                       help='even: equal slices, as the book; auto: time a few batches on '
                            'each device first and split in proportion to measured speed '
                            '(default: even)')
    p.add_argument('--warmup-steps', type=Parser.whole('--warmup-steps'), metavar='N',
                   help='raise the learning rate linearly from lr/N to lr over the first N '
                        'steps (Goyal et al. 2017; events.LinearWarmup) (default: none, the '
                        'book trains at lr from the first step)')
    p.add_argument('--sync-bn', action='store_true',
                   help='BatchNorm with statistics over the whole batch of all devices '
                        '(SyncBatchNorm; default: off)')
    p.add_argument('--parallel', choices=METHODS, default='data',
                   help="how to split training over the devices: data (the chapter: every "
                        "device a replica, a slice of every batch); scratch (the same written "
                        "by hand, on the book's LeNet); layers (consecutive layers on "
                        "consecutive devices); channels (every layer's channels split over the "
                        "devices) (default: data)")
    p.add_argument('--micro-batches', type=Parser.whole('--micro-batches'), default=1, metavar='M',
                   help='with --parallel layers: cut every batch into M micro-batches that '
                        'flow through the devices one after the other (default: 1)')
    p.add_argument('--cut', default='params',
                   help="with --parallel layers: where to cut ResNet-18 between devices: params "
                        "(even bytes of parameters), time (even measured time), or the names "
                        "of the units to cut after, e.g. stage2 (default: params)")
    p.add_argument('--save-params', type=Parser.output_file('--save-params', example='net.params'),
                   metavar='PATH',
                   help='after training, save the parameters there (net.save_parameters); in '
                        'a dist job every worker saves its own copy, rank r to PATH with '
                        '.rank<r> before the extension (default: not saved)')
    return p


def _check_outputs(args):
    """Refuse, before training, outputs that cannot be written or would write over each other,
    the checkpoints or a file of the data folder, and a checkpoint folder whose files the system
    cannot create; return the outputs, ``{real path: (flag, path given)}``."""
    from .. import data
    from ..handlers import checkpoint, plotting
    try:
        folder = data.find_data_dir(args.data_dir)
        owner = '--data-dir %s' % args.data_dir if args.data_dir else 'the data folder %s' % folder
        inputs = {p for n in data.FILES['train'] + data.FILES['test'] for p in (  # and targets
            os.path.join(os.path.realpath(folder), n), os.path.realpath(os.path.join(folder, n)))}
    except (data.DataError, data.DataNotFoundError):  # loading the data says why
        inputs = ()
    if args.checkpoint_dir is not None:  # its longest file, of the last epoch, written beside
        last = checkpoint.checkpoint_path(args.checkpoint_dir, args.epochs, 'replicas')
        problem = files.name_problem(last)
        if problem:
            raise UsageError('--checkpoint-dir %s: its file %s: %s' % (
                args.checkpoint_dir, os.path.basename(last), problem))
    seen = {}
    for flag in ('--metrics-json', '--plot', '--save-params'):
        given = getattr(args, flag[2:].replace('-', '_'))
        if not given:
            continue
        Parser.check_output(flag, given, mxnet=flag == '--save-params', example='curves.png',
                            suffixes=PLOT_SUFFIXES if flag == '--plot' else None)
        for path in plotting.plot_paths(given) if flag == '--plot' else [given]:
            problem = path != given and files.output_problem(path)
            if problem:  # the .png beside an .svg
                raise UsageError('--plot %s also writes %s: %s' % (given, path, problem))
            real = os.path.realpath(path)
            if real in seen:
                raise UsageError('%s %s and %s %s would write the same file %s; give each '
                                 'output its own path' % (seen[real] + (flag, given, real)))
            seen[real] = (flag, given)
            name = os.path.basename(real)
            mine = args.checkpoint_dir is not None and checkpoint.is_checkpoint_file(
                name) and os.path.dirname(real) == os.path.realpath(args.checkpoint_dir)
            if mine or real in inputs:
                raise UsageError('%s %s would write over a file of %s; name it otherwise or put '
                                 'it in another folder' % (flag, path, mine and '--checkpoint-dir '
                                                           '%s' % args.checkpoint_dir or owner))
            # Another run's checkpoint folder or lock, held now or resumed later (files.lock_file)
            if checkpoint.is_checkpoint_file(name) or re.fullmatch(r'\..+\.lock', name):
                raise UsageError('%s %s: %s is a name runs keep for themselves (a checkpoint\'s '
                                 'epoch-NNNN.*, a lock .lock or .NAME.lock) and another run may '
                                 'hold it; name the file otherwise' % (flag, path, name))
    return seen


def _recorded_options():
    """What ``recorded_argv`` may write: each option string, and whether it takes ``=value``."""
    options = {}
    for action in build_parser().settings:
        if action.dest not in _NOT_RECORDED:
            for option in action.option_strings:
                options[option] = action.nargs != 0
    return options


def recorded_argv(args):
    """The run's command line as its checkpoints record it: each setting given (``--flag=value``,
    in the parser's order), with the seed the run chose; ``resolve`` reads it back."""
    line = []
    for action in build_parser().settings:
        value = args.given.get(action.dest)
        if action.dest not in args.given or action.dest in _NOT_RECORDED:
            continue
        if action.nargs == 0:  # --quiet, --sync-bn, --hybridize / --no-hybridize
            line.append(action.option_strings[0 if value else -1])
        else:
            line.append('%s=%s' % (action.option_strings[0], ','.join(map(str, value))
                                   if isinstance(value, list) else value))
    return line + ([] if 'seed' in args.given else ['--seed=%d' % args.seed])


def _settings(given, argv, now=None):
    """The flags ``given`` explicitly (``now`` on this command line: all) with the parser's
    defaults for the others."""
    parser = build_parser()
    for group in parser.exclusive:  # also for a merged line: argparse's words
        both = [a.option_strings[0] for a in group if a.dest in given]
        if len(both) > 1:
            raise UsageError('argument %s: not allowed with argument %s' % tuple(both[-2:][::-1]))
    args = argparse.Namespace(**{a.dest: a.default for a in parser.settings})
    vars(args).update(given)
    args.given, args.argv, args.now = dict(given), list(argv), dict(given if now is None else now)
    return args


def _given(argv, cwd=None, now=()):
    """The settings ``argv`` gives explicitly, as argparse alone reads them (no MXNet); for a
    checkpoint's line, its relative paths read from ``cwd``, the folder its run started in (if
    recorded), without the outputs ``now``, this command line's flags, replaces."""
    parser, absent = build_parser(), object()
    # Every setting present and absent: argparse fills in no default, so what it sets was given.
    blank = argparse.Namespace(**{a.dest: absent for a in parser.settings})
    return {k: os.path.join(cwd, os.path.expanduser(v) if k == 'data_dir' else v)
            if k in OUTPUTS + ('data_dir',) and isinstance(cwd, str) else v  # as data reads it
            for k, v in vars(parser.parse_args(argv, blank)).items()
            if v is not absent and not (k in OUTPUTS and k in now)}


def resolve(argv, start=None):
    """The run ``argv`` asks for, resolved once into a read-only ``Run``; ``UsageError`` for bad
    input.

    The flags are parsed once; with ``--resume``, the command line the latest checkpoint of
    ``--checkpoint-dir`` records is read and parsed once and merged with them (the flags given
    now win; ``RUN_SETTINGS`` may not change). ``start(flags)`` is called then, before anything
    here imports MXNet (``main`` chooses the threads for the devices the flags name); then the
    flags are checked against each other and a new run with ``--checkpoint-dir`` chooses its
    seed. ``run`` verifies the checkpoint itself (``_resume``).
    """
    now, recorded = _given(argv), None
    flags = _settings(now, argv)
    if flags.resume and flags.checkpoint_dir is None:
        raise UsageError('--resume needs --checkpoint-dir DIR, the folder the run saved its '
                         'checkpoints in')
    if flags.resume:
        from ..handlers import checkpoint_names
        line, cwd = checkpoint_names.latest_argv(flags.checkpoint_dir)
        try:  # what cannot be read or parsed, _resume refuses, naming the file
            recorded = None if line is None or _unrecordable(line) else _settings(
                dict(_given(line, cwd, now), checkpoint_dir=flags.checkpoint_dir), line)
        except UsageError:
            pass
        if recorded is not None:
            flags = _settings(dict(recorded.given, **now), argv, now)  # the flags given now win
    if start is not None:
        start(flags)
    if recorded is not None:
        try:
            recorded = _complete(recorded) if recorded.seed is not None else None
        except UsageError:
            recorded = None
    if flags.resume and recorded is None:  # not a run's settings: _resume refuses it
        return Run(**vars(flags), num_workers=1, recorded=None, outputs={})
    changed = ['--%s %s (the run used %s)' % (k.replace('_', '-'), now[k], getattr(recorded, k))
               for k in RUN_SETTINGS if recorded and k in now and now[k] != getattr(recorded, k)]
    if changed:
        raise UsageError('--resume: cannot continue the run with other settings: %s; leave these '
                         'flags out (the run\'s values are used) or start a new run in another '
                         '--checkpoint-dir' % ', '.join(changed))
    return _complete(flags, recorded)


def _complete(args, recorded=None):
    """The ``Run`` of ``_settings``'s ``args``: the per-device defaults filled in, once checked
    against each other (this imports MXNet); a new run with ``--checkpoint-dir`` chooses its
    seed here."""
    from .. import parallel
    from ..parallel import dist
    from ..runtime import horovod
    num_workers = 1
    if args.kvstore in dist.DIST_KVSTORES and args.checkpoint_dir is not None:
        raise UsageError('--checkpoint-dir with --kvstore %s: MXNet 1.9.1 keeps the optimizer '
                         'state on the servers and a worker cannot save it ("Cannot save states '
                         'for distributed training"); drop --checkpoint-dir (--save-params saves '
                         'the final parameters)' % args.kvstore)
    if args.kvstore in JOB_KVSTORES:
        try:
            num_workers = (horovod.job_env()['size'] if args.kvstore == 'horovod'
                           else dist.job_env()['num_workers'])
        except ValueError as e:
            raise UsageError('--kvstore %s: %s' % (args.kvstore, e)) from None
    book_batch, book_lr = cli.BOOK_PER_DEVICE
    devices = args.num_gpus * num_workers  # the book's batch and rate grow with the devices
    batch_size, lr = args.batch_size or book_batch * devices, args.lr or book_lr * devices
    if args.train_limit is not None and args.train_limit < args.num_gpus:
        raise UsageError('--train-limit %d gives fewer training images than the %d devices, so '
                         'some device would get no data; pass --train-limit %d or more'
                         % (args.train_limit, args.num_gpus, args.num_gpus))
    if batch_size < args.num_gpus:
        raise UsageError('--batch-size %d is smaller than --num-gpus %d, so some device would '
                         'get no data; pass --batch-size %d or more'
                         % (batch_size, args.num_gpus, args.num_gpus))
    if args.device_weights is not None and len(args.device_weights) != args.num_gpus:
        raise UsageError('--device-weights %s gives %d weights but --num-gpus is %d; give '
                         'one weight per device, e.g. --device-weights %s'
                         % (','.join('%g' % w for w in args.device_weights),
                            len(args.device_weights), args.num_gpus,
                            ','.join(['1'] * args.num_gpus)))
    if args.sync_bn and args.model != 'resnet18':
        raise UsageError('--sync-bn replaces the BatchNorm layers of resnet18, but --model %s '
                         'has none; drop --sync-bn or use --model resnet18' % args.model)
    bf16 = args.dtype == 'bfloat16'
    if bf16 and (args.sync_bn or args.kvstore in JOB_KVSTORES):
        raise UsageError('--dtype bfloat16 with %s was never run; drop one of them'
                         % ('--sync-bn' if args.sync_bn else '--kvstore ' + args.kvstore))
    data_only = [flag for flag, given in (
        ('--dtype bfloat16', bf16),
        ('--kvstore %s' % args.kvstore, args.kvstore != 'device'), ('--sync-bn', args.sync_bn),
        ('--device-weights', args.device_weights is not None),
        ('--balance auto', args.balance == 'auto'),
        ('--warmup-steps', args.warmup_steps is not None),
        ('--checkpoint-dir', args.checkpoint_dir is not None)) if given]
    try:
        cut = parallel.parse_cut(args.cut)
    except ValueError as e:
        raise UsageError('argument --cut: %s (see --help)' % e) from None
    try:
        parallel.check_parallel_options(
            args.parallel, args.num_gpus, args.micro_batches, batch_size, cut,
            model=args.given.get('model'), hybridize=args.given.get('hybridize'),
            data_only=data_only)
    except ValueError as e:
        raise UsageError(str(e)) from None
    seed = args.seed
    if seed is None and args.checkpoint_dir is not None and not args.resume:
        seed = secrets.randbelow(2 ** 31)  # chosen once and recorded, to resume the same run
    return Run(**dict(vars(args), num_workers=num_workers, batch_size=batch_size, lr=lr, cut=cut,
                      model='lenet' if args.parallel == 'scratch' else args.model, seed=seed,
                      recorded=recorded, outputs=_check_outputs(args)))


def _unrecordable(recorded):
    """Why ``recorded`` (a checkpoint's ``argv``) is not a line ``recorded_argv`` writes, or
    None: it may hold no --help, --resume, folder or abbreviation."""
    if not (isinstance(recorded, list) and len(recorded) <= 100 and all(
            isinstance(a, str) and 0 < len(a) <= 4096 and '\0' not in a for a in recorded)):
        return 'argv is %s, not a command line' % json.dumps(recorded)[:40]
    options = _recorded_options()
    foreign = [a for a in recorded if options.get(a.partition('=')[0]) != bool(a.partition('=')[1])]
    if foreign:
        return 'argv holds %s, which is not a setting a run records' % json.dumps(foreign[0])[:40]
    return None


def recorded_settings(directory, record, recorded=None, now=()):
    """The settings (a ``Run``) of the run that wrote checkpoint ``record``
    (``checkpoint.read_checkpoint``) in ``directory``: its recorded command line, which may hold
    only what ``recorded_argv`` writes, parsed by the command's own parser, its relative paths
    read from its ``cwd``, its outputs but those ``now`` gives checked (``recorded``: the ``Run``
    ``resolve`` made of it, unless the line differs); else ``CheckpointError`` naming the file."""
    from ..handlers import checkpoint
    path = checkpoint.checkpoint_path(directory, record['epoch'], 'json')
    line, before = record.get('argv'), recorded
    problem = _unrecordable(line)
    if problem:
        raise checkpoint.not_ours(path, problem)
    if before is None or before.argv != line:
        try:  # the command's own parser is the one check of what the run recorded
            flags = _settings(dict(_given(line, record.get('cwd'), now),
                                   checkpoint_dir=directory), line)
            before = None if flags.seed is None else _complete(flags)
        except UsageError as e:
            raise checkpoint.CheckpointError(
                '%s records the command line %s, which the command refuses (%s); start a new '
                'run in an empty --checkpoint-dir' % (path, ' '.join(map(shlex.quote, line))[
                    :200], str(e).replace(' (see --help)', ''))) from None
    if before is None:  # recorded_argv always writes the seed
        raise checkpoint.not_ours(path, 'argv holds no --seed=N, the seed of every run')
    if record.get('network') != network_name(before):
        raise checkpoint.CheckpointError(
            '%s: network is %s, but its command line trains %s; start a new run in an empty '
            '--checkpoint-dir' % (path, json.dumps(record.get('network'))[:40],
                                  network_name(before)))
    return before


# How each output a run writes begins: a resume follows its record's paths onto these only.
_WRITTEN_BY_A_RUN = {'metrics_json': b'{\n  "format": "gluon_mgpu-metrics/',
                     'plot': (b'\x89PNG\r\n\x1a\n', b'<?xml'),
                     'save_params': b'\x12\x01\x00\x00\x00\x00\x00\x00'}  # MXNet's 0x112


def _resume(args):
    """Verify the latest checkpoint of ``args.checkpoint_dir`` and that it is the run ``args``
    continue (``resolve`` read its command line before MXNet); return its record."""
    from ..handlers import checkpoint
    directory = args.checkpoint_dir
    record = checkpoint.read_checkpoint(directory)
    if recorded_settings(directory, record, args.recorded, args.now) is not args.recorded:
        raise ValueError('%s changed while the command started; run it again' % (
            checkpoint.checkpoint_path(directory, record['epoch'], 'json')))
    before, folders = args.recorded, checkpoint.copied_from(directory, record)
    taken = runs.from_record(args)
    reused = [flag for _, flag in taken]
    for k, flag in taken:  # its argv and cwd choose them: onto a run's files only
        path = getattr(args, k)
        try:  # what cannot be read is not known to be a run's either
            with open(path, 'rb') if os.path.isfile(path) else contextlib.nullcontext() as f:
                head = f and f.read(64)
        except OSError:
            head = b''
        if head is not None and not head.startswith(_WRITTEN_BY_A_RUN[k]):
            raise ValueError('the run\'s record names %s (%s), where a file lies that no run '
                             'wrote; give %s again with the path to write (a record\'s paths '
                             'are followed onto a run\'s own files only)' % (
                                 flag, 'from its working folder %s' % record['cwd']
                                 if isinstance(record.get('cwd'), str) else 'its argv',
                                 flag.partition(' ')[0]))
    if folders is not None and reused:
        raise ValueError('the run was saved in %s, not in %s (a copy of it, or moved to another '
                         'disk): continuing it would write over the first run\'s %s; give %s '
                         'again with new paths (or the same ones, to replace them)'
                         % (folders + (', '.join(reused),
                                       ', '.join(r.partition(' ')[0] for r in reused))))
    done = record['epoch']
    if args.epochs <= done:
        raise ValueError(('the run already finished all its %d epochs' % done
                          if args.epochs == done else '--epochs %d is fewer than the %d '
                          'epochs the run already finished' % (args.epochs, done))
                         + '; pass --epochs %d or more to train it further' % (done + 1))
    if before.kvstore != args.kvstore and {before.kvstore, args.kvstore} & set(JOB_KVSTORES):
        raise ValueError('the run in %s trained with --kvstore %s; leave --kvstore out to '
                         'continue it, or start a new run in another --checkpoint-dir'
                         % (directory, before.kvstore))
    if record.get('workers', 1) != args.num_workers:
        raise ValueError('the run in %s trained with %s processes, this job has %d: its batches '
                         'and learning rate would differ; continue it with as many, or start a '
                         'new run in another --checkpoint-dir'
                         % (directory, json.dumps(record.get('workers'))[:20],
                            args.num_workers))
    if network_name(args) != record['network']:
        raise ValueError('the run in %s trained %s, these flags train %s; start a new run in '
                         'another --checkpoint-dir' % (directory, record['network'],
                                                       network_name(args)))
    return record


def _cpu_devices(num_gpus, device):
    """How many CPU contexts ``--num-gpus`` and ``--device`` make (None for GPUs), known before
    MXNet starts: the count its threads are chosen for (docs/devices.md)."""
    from ..runtime.threads import has_gpu
    return num_gpus if device == 'cpu' or (device == 'auto' and not has_gpu()) else None


def main(argv=None):
    """Entry point of ``python -m gluon_mgpu.train``; returns the exit code (docs/outputs.md).

    The run is resolved first (``resolve``): the threads are chosen for the devices its flags
    name (with ``--resume``, those of the run it continues) before MXNet starts
    (``startup.before_mxnet``), then the rest of the package loads.
    """
    entry = argv is None
    argv = sys.argv[1:] if argv is None else list(argv)
    args, joined = None, len(runs.JOINED)

    def start(flags):  # no MXNet yet
        startup.before_mxnet(PROG, _cpu_devices(flags.num_gpus, flags.device))

    def body():
        nonlocal args
        # From the entry file, a signal before DeferredInterrupt takes over is one line too.
        with startup.starting(PROG) if entry else contextlib.nullcontext():
            args = resolve(argv, start)
            from ..handlers.interrupts import DeferredInterrupt
        with DeferredInterrupt() as interrupt:
            runs.run(args, PROG, [interrupt], _resume, recorded_argv)

    def story(e):  # what cli.failure's line adds for this command
        if args is None:  # a bad flag, or MXNet did not start
            return {}
        settled = args.lr is not None  # with --resume: once merged with the run's
        simulated = args.num_gpus > 1 and _cpu_devices(args.num_gpus, args.device)
        return {'saved': lambda e, why: runs.kept(args, PROG, e, why),
                'lr': settled and ('--lr', args.lr),
                'batch': settled and ('--batch-size', args.batch_size),
                'devices': (args.num_gpus * args.num_workers, simulated or 0),
                'horovod': args.kvstore == 'horovod'}

    return cli.run_command(PROG, argv, body, story, lambda e: len(runs.JOINED) > joined or (
        entry and cli.out_of_memory(e)))  # a failed dist worker; MXNet after memory ran out
