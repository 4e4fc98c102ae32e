"""Command line: train the chapter's ResNet-18 on Fashion-MNIST, data-parallel.

    python -m gluon_mgpu.train --num-gpus 2

prints ``running on: [gpu(0), gpu(1)]`` and one line per epoch in the book's form. On a
machine with no GPU the devices are simulated on the CPU (one warning line says so).
Bad input gets one line on stderr and exit code 2.
"""
import argparse
import sys

from . import data, devices as devices_mod, training
from .model import resnet18

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


def build_parser():
    p = _Parser(prog=PROG, description='Train the chapter\'s ResNet-18 on Fashion-MNIST '
                'with data parallelism over several devices (GPUs, or simulated CPU devices).')
    p.add_argument('--num-gpus', type=_count('--num-gpus'), default=1,
                   help='number of devices to train on (default: 1)')
    p.add_argument('--batch-size', type=_count('--batch-size'), default=None,
                   help='global batch size, split over the devices '
                        '(default: 256 per device, as the book: 256 for 1, 512 for 2)')
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
    return p


def parse_args(argv=None):
    """Parse and complete the command line; the per-device defaults are filled in here."""
    args = build_parser().parse_args(argv)
    if args.batch_size is None:
        args.batch_size = 256 * args.num_gpus
    if args.lr is None:
        args.lr = 0.1 * args.num_gpus
    if args.batch_size < args.num_gpus:
        raise UsageError('%s: error: --batch-size %d is smaller than --num-gpus %d, so some '
                         'device would get no data; pass --batch-size %d or more'
                         % (PROG, args.batch_size, args.num_gpus, args.num_gpus))
    return args


def run(args):
    """Train as ``args`` say; print the running-on line and the epoch lines; return the history."""
    try:
        devices = devices_mod.get_devices(args.num_gpus, args.device)
    except ValueError as e:
        raise UsageError('%s: error: --num-gpus %d --device %s: %s'
                         % (PROG, args.num_gpus, args.device, e)) from None
    try:
        train_iter, test_iter = data.load_data_fashion_mnist(
            args.batch_size, data_dir=args.data_dir, train_limit=args.train_limit,
            test_limit=args.test_limit, seed=args.seed, loader=args.loader)
    except (data.DataError, data.DataNotFoundError) as e:
        raise UsageError('%s: error: %s' % (PROG, e)) from None
    except ValueError as e:
        raise UsageError('%s: error: %s' % (PROG, str(e).replace('train_limit', '--train-limit')
                                            .replace('test_limit', '--test-limit'))) from None
    print('running on:', devices_mod.format_devices(devices), flush=True)
    net = resnet18(10)
    if args.hybridize:
        # Not static_shape=True: on several devices MXNet 1.9.1 then loses one BatchNorm
        # running-statistics update per device (measured; the trained weights still match).
        net.hybridize(static_alloc=True)
    return training.train(net, train_iter, test_iter, devices, lr=args.lr,
                          num_epochs=args.epochs, seed=args.seed)


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
