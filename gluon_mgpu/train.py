"""Command line: train the chapter's ResNet-18 on Fashion-MNIST, data-parallel.

    python -m gluon_mgpu.train --num-gpus 2

prints ``running on: [gpu(0), gpu(1)]`` and one line per epoch in the book's form. On a
machine with no GPU the devices are simulated on the CPU (one warning line says so).
Bad input gets one line on stderr and exit code 2.

As a worker of a distributed job (``--kvstore dist_sync``, started by
``python -m gluon_mgpu.launch``) it trains on its shard of every epoch; only rank 0 prints.
"""
import argparse
import math
import os
import sys
import traceback

import mxnet as mx

from . import data, devices as devices_mod, dist, training
from .model import lenet, resnet18, sync_batch_norm

PROG = 'python -m gluon_mgpu.train'


class UsageError(Exception):
    """Bad command-line input; the message is the whole line shown to the user."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError('%s: error: %s (see --help)' % (PROG, message))


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


def _int(flag):
    def parse(text):
        try:
            return int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                '%s expects a whole number, got %r; for example %s 0' % (flag, text, flag))
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


MODELS = {'resnet18': resnet18, 'lenet': lenet}
KVSTORES = ('device', 'local') + dist.DIST_KVSTORES


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
    p.add_argument('--device', choices=devices_mod.DEVICE_CHOICES, default='auto',
                   help='auto: GPUs if there are enough, simulated CPU devices if there is no '
                        'GPU; gpu: GPUs or an error; cpu: CPU contexts (default: auto)')
    p.add_argument('--data-dir', default=None,
                   help='folder with the four Fashion-MNIST IDX .gz files (default: search '
                        '$MXNET_HOME/datasets/fashion-mnist, then /usr/share/datasets/fashion-mnist)')
    p.add_argument('--train-limit', type=_count('--train-limit'), default=None,
                   help='use only the first N training images (default: all 60000)')
    p.add_argument('--test-limit', type=_count('--test-limit'), default=None,
                   help='use only the first N test images (default: all 10000)')
    p.add_argument('--hybridize', action=argparse.BooleanOptionalAction, default=True,
                   help='compile the network into one graph (same results as imperative, about '
                        'twice as fast on CPU); --no-hybridize runs it line by line as the book '
                        'does (default: hybridize)')
    p.add_argument('--loader', choices=tuple(data.LOADERS), default='array',
                   help="array: the data set as one float32 array, batches by slicing; gluon: "
                        "the book's DataLoader with ToTensor per image (default: array)")
    p.add_argument('--seed', type=_int('--seed'), default=None,
                   help='seed for initialization and data order (default: none, a new run '
                        'each time)')
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
    p.add_argument('--save-params', default=None, metavar='PATH',
                   help='after training, save the parameters there (net.save_parameters); in '
                        'a dist job every worker saves its own copy, rank r to PATH with '
                        '.rank<r> before the extension (default: not saved)')
    return p


def parse_args(argv=None):
    """Parse and complete the command line; the per-device defaults are filled in here.

    In a dist job (``--kvstore dist_sync``, ``dist_device_sync``) the per-device defaults
    count the devices of all workers: ``args.num_workers`` is read from ``DMLC_NUM_WORKER``.
    """
    args = build_parser().parse_args(argv)
    args.num_workers = 1
    if args.kvstore in dist.DIST_KVSTORES:
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
    if args.save_params is not None:
        folder = os.path.dirname(os.path.abspath(args.save_params))
        if not os.path.isdir(folder):
            raise UsageError('%s: error: --save-params %s: folder %s does not exist; create it '
                             'or choose another path' % (PROG, args.save_params, folder))
    return args


def _check_job(args, devices):
    """Check a dist run before joining the job; return the number of workers."""
    workers = args.num_workers
    if args.batch_size % workers or args.batch_size // workers < len(devices):
        share = max(workers * len(devices), args.batch_size // workers * workers)
        raise UsageError('%s: error: --batch-size %d cannot be shared by %d workers with %d '
                         'device(s) each (every worker takes an equal share, at least one '
                         'example per device); pass --batch-size %d'
                         % (PROG, args.batch_size, workers, len(devices), share))
    return workers


def _abort(error):
    """Leave a dist job at once: a normal exit would wait for the other workers forever."""
    if isinstance(error, UsageError):
        print(error, file=sys.stderr)
        code = 2
    else:
        traceback.print_exception(type(error), error, error.__traceback__)
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _format_weights(devices, weights, batch, measured):
    sizes = training.slice_sizes(batch, weights)
    values = ', '.join('%s %s' % (d, ('%.1f' % w) if measured else ('%g' % w))
                       for d, w in zip(devices, weights))
    return 'device weights: %s%s -> slices of %s per batch of %d' % (
        values, ' images/s (measured)' if measured else '', ', '.join(map(str, sizes)), batch)


def run(args):
    """Train as ``args`` say; print the running-on line and the epoch lines; return the history."""
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
    try:
        train_iter, test_iter = data.load_data_fashion_mnist(
            args.batch_size, data_dir=args.data_dir, train_limit=args.train_limit,
            test_limit=args.test_limit, seed=args.seed, loader=args.loader)
    except (data.DataError, data.DataNotFoundError) as e:
        raise UsageError('%s: error: %s' % (PROG, e)) from None
    except ValueError as e:
        raise UsageError('%s: error: %s' % (PROG, str(e).replace('train_limit', '--train-limit')
                                            .replace('test_limit', '--test-limit'))) from None
    if args.kvstore not in dist.DIST_KVSTORES:
        return _train(args, devices, train_iter, test_iter, args.kvstore, args.seed, rank=0,
                      workers=1)
    workers = _check_job(args, devices)
    try:
        train_iter.set_part(workers, 0)
    except ValueError as e:
        raise UsageError('%s: error: --kvstore %s: %s (--train-limit %s, --batch-size %d)'
                         % (PROG, args.kvstore, e, args.train_limit, args.batch_size)) from None
    kv = mx.kv.create(args.kvstore)  # joins the job: waits for every process
    try:
        train_iter.set_part(kv.num_workers, kv.rank)
        seed = dist.shared_seed(kv, args.seed)
        train_iter.seed = seed
        return _train(args, devices, train_iter, test_iter, kv, seed, rank=kv.rank,
                      workers=kv.num_workers)
    except BaseException as e:
        _abort(e)


def _train(args, devices, train_iter, test_iter, kvstore, seed, rank, workers):
    if rank == 0:
        where = devices_mod.format_devices(devices)
        if workers > 1 or args.kvstore in dist.DIST_KVSTORES:
            where += ' (worker 0 of %d, kvstore %s)' % (workers, args.kvstore)
        print('running on:', where, flush=True)
    norm_layer = sync_batch_norm(len(devices)) if args.sync_bn else None
    net = resnet18(10, norm_layer=norm_layer) if args.model == 'resnet18' else lenet(10)
    if args.hybridize:
        # Not static_shape=True: on several devices MXNet 1.9.1 then loses one BatchNorm
        # running-statistics update per device (measured; the trained weights still match).
        net.hybridize(static_alloc=True)
    weights = args.device_weights
    local_batch = args.batch_size // workers
    if args.balance == 'auto':
        X, y = next(iter(test_iter))
        share = max(1, min(X.shape[0], local_batch // len(devices)))
        net.initialize(mx.init.Normal(sigma=0.01), ctx=devices)
        weights = training.measure_device_speeds(net, X[:share], y[:share], devices)
    if weights is not None and rank == 0:
        print(_format_weights(devices, weights, local_batch, args.balance == 'auto'),
              flush=True)
    history = training.train(net, train_iter, test_iter, devices, lr=args.lr,
                             num_epochs=args.epochs, seed=seed, kvstore=kvstore,
                             device_weights=weights)
    if args.save_params is not None:
        distributed = args.kvstore in dist.DIST_KVSTORES
        net.save_parameters(dist.rank_path(args.save_params, rank) if distributed
                            else args.save_params)
    return history


def main(argv=None):
    """Entry point of ``python -m gluon_mgpu.train``; returns the exit code."""
    try:
        run(parse_args(argv))
    except UsageError as e:
        print(e, file=sys.stderr)
        return 2
    return 0


if __name__ == '__main__':
    sys.exit(main())
