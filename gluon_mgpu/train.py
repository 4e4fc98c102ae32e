"""Command line: train the chapter's ResNet-18 on Fashion-MNIST, data-parallel.

    python -m gluon_mgpu.train --num-gpus 2

prints ``running on: [gpu(0), gpu(1)]``, one line per epoch in the book's form (on a terminal,
a progress bar while the epoch runs) and a summary line in the newer edition's form:
``test acc: 0.91, 12.3 sec/epoch on [gpu(0), gpu(1)]``. On a machine with no GPU the devices
are simulated on the CPU (one warning line says so). ``--metrics-json`` and ``--plot`` write
the run's numbers and curves to files. Bad input gets one line on stderr and exit code 2.

With ``--checkpoint-dir DIR`` every finished epoch is saved (see ``gluon_mgpu.checkpoint``) and
``--resume`` continues the run. Exit codes: 0 done, 1 training diverged or an unexpected error
(one line; ``--debug`` or ``GLUON_MGPU_DEBUG=1`` shows the traceback), 2 bad input or a
checkpoint that cannot be used, 130 interrupted by Ctrl-C.

With ``--check-replicas N`` the replicas of the parameters on the devices are compared every N
steps and after each epoch (one summary line per epoch, see ``gluon_mgpu.replicas``); trained
parameters that differ stop the run with one line on stderr and exit code 1.

As a worker of a distributed job (``--kvstore dist_sync``, started by
``python -m gluon_mgpu.launch``) it trains on its shard of every epoch; only rank 0 prints
and writes files.
"""
import argparse
import math
import os
import secrets
import shlex
import sys
import traceback

import mxnet as mx

from . import (checkpoint, data, devices as devices_mod, dist, metrics, plotting, progress,
               replicas, training)
from .cli import UsageError, _Parser, add_device_flag
from .interrupts import DeferredInterrupt
from .model import lenet, resnet18, sync_batch_norm

PROG = 'python -m gluon_mgpu.train'
DEBUG_ENV = 'GLUON_MGPU_DEBUG'
MODELS = {'resnet18': resnet18, 'lenet': lenet}
KVSTORES = ('device', 'local') + dist.DIST_KVSTORES
# Flags that are not settings of the run, so a checkpoint does not record them.
_NOT_RECORDED = ('given', 'checkpoint_dir', 'resume', 'debug')


class ReplicaCheckFailed(Exception):
    """``--check-replicas`` found trained parameters that differ; the message is the whole line."""


def _count(flag):
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                '%s expects a whole number, got %r; for example %s 2' % (flag, text, flag))
        if value < 1:
            raise argparse.ArgumentTypeError(
                '%s must be at least 1, got %d; for example %s 2' % (flag, value, flag))
        return value
    return parse


def _positive_float(flag):
    def parse(text):
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                '%s expects a number, got %r; for example %s 0.1' % (flag, text, flag))
        if not value > 0 or value == float('inf'):
            raise argparse.ArgumentTypeError(
                '%s must be a finite number above 0, got %r; for example %s 0.1'
                % (flag, text, flag))
        return value
    return parse


def _seed(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            '--seed expects a whole number, got %r; for example --seed 0' % (text,))
    # MXNet's seed is a C int; numpy's generator refuses negative seeds.
    if not 0 <= value < 2 ** 31:
        raise argparse.ArgumentTypeError(
            '--seed must be between 0 and %d, got %d; for example --seed 0'
            % (2 ** 31 - 1, value))
    return value


def output_file_problem(path):
    """Return why ``path`` cannot be written as a new or replaced file, or None if it can."""
    if os.path.isdir(path):
        return 'it is a folder; name a file in it'
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.exists(folder):
        return 'folder %s does not exist; create it first' % folder
    if not os.path.isdir(folder):
        return '%s is not a folder; name a file in a folder' % folder
    if not os.access(folder, os.W_OK | os.X_OK):
        return 'folder %s is not writable; choose another folder' % folder
    return None


def _output_file(flag, suffixes=None, example='run.json'):
    def parse(text):
        path = os.path.expanduser(text)
        problem = output_file_problem(path)
        if problem:
            raise argparse.ArgumentTypeError('%s %s: %s' % (flag, text, problem))
        if suffixes and os.path.splitext(path)[1].lower() not in suffixes:
            raise argparse.ArgumentTypeError(
                '%s %s: the name must end in %s; for example %s %s'
                % (flag, text, ' or '.join(suffixes), flag, example))
        return path
    return parse


def _weights(text):
    try:
        values = [float(v) for v in text.split(',')]
    except ValueError:
        raise argparse.ArgumentTypeError(
            '--device-weights expects numbers separated by commas, got %r; for example '
            '--device-weights 3,1' % text)
    if not all(math.isfinite(v) and v > 0 for v in values):
        raise argparse.ArgumentTypeError(
            '--device-weights must all be finite numbers above 0, got %r; for example '
            '--device-weights 3,1' % text)
    return values


def network_name(args):
    """The network ``args`` describe, as checkpoints record it: ``resnet18(10)``, ``lenet(10)``."""
    if args.model == 'lenet':
        return 'lenet(10)'
    if args.sync_bn:
        return 'resnet18(10, norm_layer=sync_batch_norm(%d))' % args.num_gpus
    return 'resnet18(10)'


def build_parser():
    p = _Parser(prog=PROG, description='Train the chapter\'s ResNet-18 on Fashion-MNIST '
                'with data parallelism over several devices (GPUs, or simulated CPU devices).')
    p.add_argument('--num-gpus', type=_count('--num-gpus'), default=1,
                   help='number of devices to train on (default: 1)')
    p.add_argument('--batch-size', type=_count('--batch-size'), default=None,
                   help='global batch size, split over the devices '
                        '(default: 256 per device, as the book: 256 for 1, 512 for 2; in a '
                        'dist job, per device of all workers)')
    p.add_argument('--lr', type=_positive_float('--lr'), default=None,
                   help='SGD learning rate (default: 0.1 per device, as the book: 0.1, 0.2)')
    p.add_argument('--epochs', type=_count('--epochs'), default=4,
                   help='number of epochs (default: 4)')
    add_device_flag(p)
    p.add_argument('--data-dir', default=None,
                   help='folder with the four Fashion-MNIST IDX .gz files (default: search '
                        '$MXNET_HOME/datasets/fashion-mnist, then /usr/share/datasets/fashion-mnist)')
    p.add_argument('--train-limit', type=_count('--train-limit'), default=None,
                   help='use only the first N training images (default: all 60000)')
    p.add_argument('--test-limit', type=_count('--test-limit'), default=None,
                   help='use only the first N test images (default: all 10000)')
    p.add_argument('--hybridize', action=argparse.BooleanOptionalAction, default=True,
                   help='compile the network into one graph (same results as imperative, '
                        '1.2x as fast on a 2-core CPU, docs/benchmarks.md); --no-hybridize runs '
                        'it line by line as the book does (default: hybridize)')
    p.add_argument('--loader', choices=tuple(data.LOADERS), default='array',
                   help="array: the data set as one float32 array, batches by slicing; gluon: "
                        "the book's DataLoader with ToTensor per image (default: array)")
    p.add_argument('--seed', type=_seed, default=None,
                   help='seed for initialization and data order (default: none, a new run '
                        'each time; with --checkpoint-dir one is chosen and recorded)')
    p.add_argument('--checkpoint-dir', metavar='DIR', default=None,
                   help='save a checkpoint into DIR at the end of every epoch (default: none)')
    p.add_argument('--resume', action='store_true',
                   help='continue the run saved in --checkpoint-dir from its last checkpoint; '
                        'flags left out take the run\'s values')
    p.add_argument('--debug', action='store_true',
                   help='on an error, show the full traceback (for bug reports); the '
                        'environment variable %s=1 does the same' % DEBUG_ENV)
    p.add_argument('--check-replicas', type=_count('--check-replicas'), default=None,
                   metavar='N',
                   help='every N steps and after each epoch, check that the trained parameters '
                        'are identical on every device; print one summary line per epoch and '
                        'stop with exit code 1 on a mismatch (default: no check)')
    p.add_argument('--quiet', action='store_true',
                   help='print only the final summary line (warnings and errors still go to '
                        'stderr)')
    p.add_argument('--metrics-json', type=_output_file('--metrics-json'), default=None,
                   metavar='PATH',
                   help='write arguments, devices, per-epoch numbers and the summary to this '
                        'JSON file, rewritten after every epoch (docs/metrics-schema.md)')
    p.add_argument('--plot', type=_output_file('--plot', plotting.PLOT_SUFFIXES, 'curves.png'),
                   default=None, metavar='PATH',
                   help='draw test accuracy and training loss per epoch into this .png (an '
                        '.svg name writes the .svg and a .png beside it), redrawn every epoch')
    p.add_argument('--model', choices=tuple(MODELS), default='resnet18',
                   help="resnet18: the chapter's network; lenet: the book's LeNet, without "
                        'BatchNorm, whose result does not depend on how batches are split '
                        '(default: resnet18)')
    p.add_argument('--kvstore', choices=KVSTORES, default='device',
                   help='how gradients are summed: device (on the devices, the book\'s '
                        'Trainer default), local (on the CPU), dist_sync / dist_device_sync '
                        '(also over the workers of a job started by python -m '
                        'gluon_mgpu.launch; --batch-size is then the batch of all workers '
                        'together) (default: device)')
    split = p.add_mutually_exclusive_group()
    split.add_argument('--device-weights', type=_weights, default=None, metavar='W1,W2,...',
                       help='split every batch in proportion to these weights, one per '
                            'device, e.g. 3,1 for a device three times as fast (default: '
                            'even split)')
    split.add_argument('--balance', choices=('even', 'auto'), default='even',
                       help='even: equal slices, as the book; auto: time a few batches on '
                            'each device first and split in proportion to measured speed '
                            '(default: even)')
    p.add_argument('--sync-bn', action='store_true',
                   help='BatchNorm with statistics over the whole batch of all devices '
                        '(SyncBatchNorm); GPUs only, it deadlocks on CPU contexts in MXNet '
                        '1.9.1 (default: off)')
    p.add_argument('--save-params', type=_output_file('--save-params', example='net.params'),
                   default=None, metavar='PATH',
                   help='after training, save the parameters there (net.save_parameters); in '
                        'a dist job every worker saves its own copy, rank r to PATH with '
                        '.rank<r> before the extension (default: not saved)')
    return p


def _given_flags(argv):
    """The settings given explicitly in ``argv``, as ``{dest: value}``."""
    parser, absent = build_parser(), object()
    parser.set_defaults(**dict.fromkeys(vars(parser.parse_args([])), absent))
    return {k: v for k, v in vars(parser.parse_args(argv)).items() if v is not absent}


def parse_args(argv=None):
    """Parse and complete the command line; the per-device defaults are filled in here.

    ``args.given`` holds the settings given explicitly (``--resume`` takes the others from the
    checkpoint).
    """
    args = build_parser().parse_args(argv)
    args.given = _given_flags(argv)
    if args.resume and args.checkpoint_dir is None:
        raise UsageError('%s: error: --resume needs --checkpoint-dir DIR, the folder the run '
                         'saved its checkpoints in' % PROG)
    args.num_workers = 1
    if args.kvstore in dist.DIST_KVSTORES:
        if args.checkpoint_dir is not None:
            raise UsageError('%s: error: --checkpoint-dir with --kvstore %s: MXNet 1.9.1 keeps '
                             'the optimizer state on the servers and a worker cannot save it '
                             '("Cannot save states for distributed training"); drop '
                             '--checkpoint-dir (--save-params saves the final parameters)'
                             % (PROG, args.kvstore))
        try:
            args.num_workers = dist.job_env()['num_workers']
        except ValueError as e:
            raise UsageError('%s: error: --kvstore %s: %s' % (PROG, args.kvstore, e)) from None
    all_devices = args.num_gpus * args.num_workers
    if args.batch_size is None:
        args.batch_size = 256 * all_devices
    if args.lr is None:
        args.lr = 0.1 * all_devices
    if args.batch_size < args.num_gpus:
        raise UsageError('%s: error: --batch-size %d is smaller than --num-gpus %d, so some '
                         'device would get no data; pass --batch-size %d or more'
                         % (PROG, args.batch_size, args.num_gpus, args.num_gpus))
    if args.device_weights is not None and len(args.device_weights) != args.num_gpus:
        raise UsageError('%s: error: --device-weights %s gives %d weights but --num-gpus is '
                         '%d; give one weight per device, e.g. --device-weights %s'
                         % (PROG, ','.join('%g' % w for w in args.device_weights),
                            len(args.device_weights), args.num_gpus,
                            ','.join(['1'] * args.num_gpus)))
    if args.sync_bn and args.model != 'resnet18':
        raise UsageError('%s: error: --sync-bn replaces the BatchNorm layers of resnet18, but '
                         '--model %s has none; drop --sync-bn or use --model resnet18'
                         % (PROG, args.model))
    return args


def _resume_command(directory, extra=''):
    return '%s --checkpoint-dir %s --resume%s' % (PROG, shlex.quote(directory), extra)


def _prepare_checkpoints(args):
    """Check --checkpoint-dir; for --resume merge the run's settings into ``args``; return the
    checkpoint record to resume from (or None)."""
    directory = args.checkpoint_dir
    record = None
    if args.resume:
        try:
            record = checkpoint.read_checkpoint(directory)
            settings = checkpoint.resume_settings(record, {
                k: v for k, v in args.given.items() if k not in _NOT_RECORDED})
        except (checkpoint.CheckpointError, ValueError) as e:
            raise UsageError('%s: error: --resume: %s' % (PROG, e)) from None
        for k, v in settings.items():
            setattr(args, k, v)
        # Checkpoints from before --model record no model: they trained resnet18.
        if record.get('network') != network_name(args):
            raise UsageError('%s: error: --resume: the run in %s trained %s, these flags train '
                             '%s; start a new run in another --checkpoint-dir'
                             % (PROG, directory, record.get('network'), network_name(args)))
    else:
        done = checkpoint.list_checkpoints(directory)
        if done:
            raise UsageError('%s: error: --checkpoint-dir %s already holds the checkpoints of a '
                             'run (up to epoch %d); add --resume to continue it, or pass another '
                             'folder to start a new run' % (PROG, directory, done[-1]))
        if args.seed is None:
            args.seed = secrets.randbelow(2 ** 31)
    try:
        checkpoint.prepare_dir(directory)
    except ValueError as e:
        raise UsageError('%s: error: --checkpoint-dir %s: %s' % (PROG, directory, e)) from None
    return record


def _saver(args, net, trainer, devices, history):
    """The on_epoch hook that writes a checkpoint after every epoch."""
    history = list(history)
    recorded = {k: v for k, v in vars(args).items() if k not in _NOT_RECORDED}

    def save(record):
        history.append(record)
        checkpoint.save_checkpoint(args.checkpoint_dir, record['epoch'], net, trainer, {
            'args': recorded, 'data_seed': args.seed, 'network': network_name(args),
            'devices': [str(d) for d in devices], 'history': history})
    return save


def run(args, interrupt=None):
    """Train as ``args`` say; print progress and the summary; write checkpoints, metrics, plot.

    ``interrupt``, a ``DeferredInterrupt``, is checked after every step and every epoch (after
    its checkpoint), where it raises a Ctrl-C that came inside MXNet's optimizer callback.
    Returns ``train()``'s history.
    """
    record = None
    if args.checkpoint_dir is not None:
        record = _prepare_checkpoints(args)
    try:
        train_iter, test_iter = data.load_data_fashion_mnist(
            args.batch_size, data_dir=args.data_dir, train_limit=args.train_limit,
            test_limit=args.test_limit, seed=args.seed, loader=args.loader)
    except (data.DataError, data.DataNotFoundError) as e:
        flag = '' if args.data_dir is None else '--data-dir %s: ' % args.data_dir
        raise UsageError('%s: error: %s%s' % (PROG, flag, e)) from None
    except ValueError as e:
        raise UsageError('%s: error: %s' % (PROG, str(e).replace('train_limit', '--train-limit')
                                            .replace('test_limit', '--test-limit')
                                            .replace('or None for all', 'or leave it out for all')
                                            )) from None
    # After the data: the device check may log a warning, and bad input gets one line only.
    try:
        devices = devices_mod.get_devices(args.num_gpus, args.device)
    except ValueError as e:
        raise UsageError('%s: error: --num-gpus %d --device %s: %s'
                         % (PROG, args.num_gpus, args.device, e)) from None
    if args.sync_bn and any(d.device_type == 'cpu' for d in devices):
        raise UsageError('%s: error: --sync-bn on CPU contexts deadlocks in MXNet 1.9.1 '
                         '(SyncBatchNorm blocks an engine thread until every device arrives, '
                         'holding scratch memory that all CPU contexts share); use it with '
                         'GPUs (--device gpu), or drop --sync-bn' % PROG)
    kvstore, args.rank = args.kvstore, 0
    if args.kvstore in dist.DIST_KVSTORES:
        kvstore = _join_job(args, devices, train_iter)
        args.rank = kvstore.rank
    lead = args.rank == 0  # the one worker of a dist job that prints and writes files
    mode = progress.choose_mode(quiet=args.quiet or not lead)
    if mode != 'quiet':
        where = devices_mod.format_devices(devices)
        if args.kvstore in dist.DIST_KVSTORES:
            where += ' (worker 0 of %d, kvstore %s)' % (args.num_workers, args.kvstore)
        print('running on:', where, flush=True)
    if args.model == 'lenet':
        net = lenet(10)
    else:
        net = resnet18(10, norm_layer=sync_batch_norm(len(devices)) if args.sync_bn else None)
    if args.hybridize:
        # Not static_shape=True: on several devices MXNet 1.9.1 then loses one BatchNorm
        # running-statistics update per device (measured; the trained weights still match).
        net.hybridize(static_alloc=True)
    trainer = training.init_training(net, devices, args.lr, args.seed, kvstore)
    start, history = 0, []
    if record is not None:
        try:
            checkpoint.restore(args.checkpoint_dir, record, net, trainer, devices)
        except checkpoint.CheckpointError as e:
            raise UsageError('%s: error: --resume: %s' % (PROG, e)) from None
        trainer.set_learning_rate(args.lr)
        start, history = record['epoch'], record['history']
        if mode != 'quiet':
            print('resuming after epoch %d of %d from %s' % (
                start, args.epochs,
                checkpoint.checkpoint_path(args.checkpoint_dir, start, 'json')), flush=True)
    weights = _device_weights(args, net, devices, test_iter)
    if weights is not None and mode != 'quiet':
        print(_format_weights(devices, weights, args.batch_size // args.num_workers,
                              args.balance == 'auto'), flush=True)
    save = None if args.checkpoint_dir is None else _saver(args, net, trainer, devices, history)
    metrics_file = None
    if args.metrics_json and lead:
        try:
            metrics_file = metrics.MetricsFile(
                args.metrics_json, {k: v for k, v in vars(args).items() if k != 'given'},
                devices)
            for done_record in history:
                metrics_file.add_epoch(done_record)
        except OSError as e:
            raise UsageError('%s: error: --metrics-json %s: cannot write it (%s); choose '
                             'another path' % (PROG, args.metrics_json, e.strerror or e)) from None
    report = progress.Progress(args.epochs, getattr(train_iter, 'examples_per_epoch', None),
                               mode)
    title = '%s, Fashion-MNIST: %s, batch %d, lr %g' % (
        'LeNet' if args.model == 'lenet' else 'ResNet-18', devices_mod.format_devices(devices),
        args.batch_size, args.lr)
    done = list(history)
    check_step, check_epoch = (None, None) if args.check_replicas is None else \
        replica_checks(net, args.check_replicas, verbose=mode != 'quiet')

    def on_step(epoch, step):
        if check_step is not None:
            check_step(epoch, step)
        if interrupt is not None:
            interrupt.check()

    def on_epoch(record):
        # The checkpoint first: it is what a crash must not lose.
        if save is not None:
            save(record)
        report.on_epoch(record)
        if check_epoch is not None:
            check_epoch(record)
        done.append(record)
        if metrics_file is not None:
            metrics_file.add_epoch(record)
        if args.plot and lead:
            plotting.plot_history(done, args.plot, title=title, num_epochs=args.epochs)
        if interrupt is not None:
            interrupt.check()

    try:
        history = training.train(net, train_iter, test_iter, devices, lr=args.lr,
                                 num_epochs=args.epochs, seed=args.seed, verbose=False,
                                 trainer=trainer, start_epoch=start, history=history,
                                 on_step=on_step, on_batch=report.on_batch,
                                 on_epoch=on_epoch, kvstore=kvstore, device_weights=weights)
    finally:
        report.close()
    if args.save_params is not None:
        net.save_parameters(dist.rank_path(args.save_params, args.rank)
                            if args.kvstore in dist.DIST_KVSTORES else args.save_params)
    summary = metrics.summarize(history, devices)
    if lead:
        print(summary['line'], flush=True)
    if metrics_file is not None:
        metrics_file.finish(summary)
    return history


def _join_job(args, devices, train_iter):
    """Check a dist run, join the job, take this worker's shard and the shared seed; return the kvstore."""
    workers = args.num_workers
    if args.batch_size % workers or args.batch_size // workers < len(devices):
        share = max(workers * len(devices), args.batch_size // workers * workers)
        raise UsageError('%s: error: --batch-size %d cannot be shared by %d workers with %d '
                         'device(s) each (every worker takes an equal share, at least one '
                         'example per device); pass --batch-size %d'
                         % (PROG, args.batch_size, workers, len(devices), share))
    try:
        train_iter.set_part(workers, 0)
    except ValueError as e:
        raise UsageError('%s: error: --kvstore %s: %s (--train-limit %s, --batch-size %d)'
                         % (PROG, args.kvstore, e, args.train_limit, args.batch_size)) from None
    kv = mx.kv.create(args.kvstore)  # joins the job: waits for every process
    # From here on, leaving normally would wait for the other workers (see main).
    args.joined = True
    train_iter.set_part(kv.num_workers, kv.rank)
    args.seed = train_iter.seed = dist.shared_seed(kv, args.seed)
    return kv


def _device_weights(args, net, devices, test_iter):
    """The weights of --device-weights, or measured for --balance auto, or None (even split)."""
    if args.balance != 'auto':
        return args.device_weights
    X, y = next(iter(test_iter))
    share = max(1, min(X.shape[0], args.batch_size // args.num_workers // len(devices)))
    return training.measure_device_speeds(net, X[:share], y[:share], devices)


def _format_weights(devices, weights, batch, measured):
    sizes = training.slice_sizes(batch, weights)
    values = ', '.join('%s %s' % (d, ('%.1f' % w) if measured else ('%g' % w))
                       for d, w in zip(devices, weights))
    return 'device weights: %s%s -> slices of %s per batch of %d' % (
        values, ' images/s (measured)' if measured else '', ', '.join(map(str, sizes)), batch)


def _check(net, where):
    try:
        return replicas.assert_replicas_match(net)
    except replicas.ReplicaMismatchError as e:
        raise ReplicaCheckFailed('%s: error: --check-replicas: at %s, %s'
                                 % (PROG, where, e)) from None


def replica_checks(net, every, verbose=True):
    """Return ``(on_step, on_epoch)`` hooks for ``train()`` that check ``net``'s replicas.

    ``on_step`` checks after every ``every``-th step of an epoch; ``on_epoch`` checks again and,
    if ``verbose``, prints ``format_replica_summary`` of the report. A mismatch raises
    ``ReplicaCheckFailed``.
    """
    def on_step(epoch, step):
        if step % every == 0:
            _check(net, 'epoch %d, step %d' % (epoch, step))

    def on_epoch(record):
        report = _check(net, 'the end of epoch %d' % record['epoch'])
        if verbose:
            print(replicas.format_replica_summary(report), flush=True)

    return on_step, on_epoch


def _saved_epochs(args):
    if args is None or args.checkpoint_dir is None:
        return None
    done = checkpoint.list_checkpoints(args.checkpoint_dir)
    return done[-1] if done else 0


def _interrupted(args):
    done = _saved_epochs(args)
    if done is None:
        return ('%s: interrupted (Ctrl-C); nothing was saved (pass --checkpoint-dir DIR to keep '
                'every finished epoch)' % PROG)
    if done == 0:
        return ('%s: interrupted (Ctrl-C) before the first epoch finished, so %s holds no '
                'checkpoint yet; run the same command again to start over'
                % (PROG, args.checkpoint_dir))
    return ('%s: interrupted (Ctrl-C); the checkpoint of epoch %d in %s is complete; to resume: '
            '%s' % (PROG, done, args.checkpoint_dir, _resume_command(args.checkpoint_dir)))


def _diverged(e, args):
    smaller = '--lr %g' % (e.lr / 10)
    done = _saved_epochs(args)
    if not done:
        fix = 'start again with a smaller learning rate, for example %s' % smaller
    else:
        # The last checkpoint had a finite loss, but its weights may be far off already.
        fix = ('use a smaller learning rate, for example %s: start again in a new '
               '--checkpoint-dir, or continue from epoch %d, the last checkpoint with a finite '
               'loss: %s' % (smaller, done, _resume_command(args.checkpoint_dir, ' ' + smaller)))
    return ('%s: error: the training loss became %s at epoch %d, step %d with --lr %g: training '
            'diverged; %s' % (PROG, e.loss, e.epoch, e.step, e.lr, fix))


def _one_line(e):
    lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
    if not lines:
        return type(e).__name__
    # MXNet's errors start with a C++ stack trace and end with "MXNetError: message".
    line = lines[-1] if 'Traceback' in lines[0] else lines[0]
    prefix = type(e).__name__ + ': '
    return line[len(prefix):] if line.startswith(prefix) else line


def _debug_requested(argv):
    """Whether to show tracebacks: ``--debug`` in ``argv`` or ``GLUON_MGPU_DEBUG`` set, not to 0."""
    return '--debug' in argv or os.environ.get(DEBUG_ENV, '') not in ('', '0')


def _unexpected(prog, e, debug, context=''):
    """The one line for an unexpected error: its type and message, ``context``, a --debug hint."""
    hint = '' if debug else ('; rerun with --debug (or %s=1) for the full traceback, and '
                             'include it in a bug report' % DEBUG_ENV)
    return '%s: error: unexpected %s: %s%s%s' % (prog, type(e).__name__, _one_line(e), context,
                                                 hint)


def _fail(e, message, code, debug):
    if debug:
        traceback.print_exception(type(e), e, e.__traceback__)
    # One write for the whole line: the workers of a dist job share the launcher's stderr.
    sys.stderr.write(message + '\n')
    sys.stderr.flush()
    return code


def main(argv=None):
    """Entry point of ``python -m gluon_mgpu.train``; returns the exit code.

    0: done. 1: training diverged (NaN or infinite loss), trained parameters differ between
    devices (``--check-replicas``), or an unexpected error. 2: bad input,
    or a checkpoint that cannot be used. 130: interrupted (Ctrl-C). Every failure prints one
    line on stderr; with ``--debug`` or ``GLUON_MGPU_DEBUG=1`` the traceback comes first.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    debug = _debug_requested(argv)
    args = None
    code = 0
    try:
        args = parse_args(argv)
        with DeferredInterrupt() as interrupt:
            run(args, interrupt)
    except UsageError as e:
        code = _fail(e, str(e), 2, debug)
    except KeyboardInterrupt as e:
        code = _fail(e, _interrupted(args), 130, debug)
    except training.LossNotFiniteError as e:
        code = _fail(e, _diverged(e, args), 1, debug)
    except ReplicaCheckFailed as e:
        code = _fail(e, str(e), 1, debug)
    except Exception as e:
        code = _fail(e, _unexpected(PROG, e, debug), 1, debug)
    if code and getattr(args, 'joined', False):
        # A failed worker of a dist job leaves at once: a normal exit would wait at MXNet's
        # final barrier for the other workers, which wait for this one's gradients.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


if __name__ == '__main__':
    sys.exit(main())
