"""Command line: train the chapter's ResNet-18 on Fashion-MNIST, data-parallel.

    python -m gluon_mgpu.train --num-gpus 2

prints ``running on: [gpu(0), gpu(1)]``, one line per epoch in the book's form (on a terminal,
a progress bar while the epoch runs) and a summary line in the newer edition's form:
``test acc: 0.91, 12.3 sec/epoch on [gpu(0), gpu(1)]``. On a machine with no GPU the devices
are simulated on the CPU (one warning line says so). ``--metrics-json`` and ``--plot`` write
the run's numbers and curves to files. Bad input gets one line on stderr and exit code 2.
"""
import argparse
import os
import sys

from . import data, devices as devices_mod, metrics, plotting, progress, training
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
    """Train as ``args`` say; print progress and the summary; write metrics and plot.

    Returns ``train()``'s history.
    """
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
    mode = progress.choose_mode(quiet=args.quiet)
    if mode != 'quiet':
        print('running on:', devices_mod.format_devices(devices), flush=True)
    net = resnet18(10)
    if args.hybridize:
        # Not static_shape=True: on several devices MXNet 1.9.1 then loses one BatchNorm
        # running-statistics update per device (measured; the trained weights still match).
        net.hybridize(static_alloc=True)
    metrics_file = None
    if args.metrics_json:
        try:
            metrics_file = metrics.MetricsFile(args.metrics_json, vars(args), devices)
        except OSError as e:
            raise UsageError('%s: error: --metrics-json %s: cannot write it (%s); choose '
                             'another path' % (PROG, args.metrics_json, e.strerror or e)) from None
    report = progress.Progress(args.epochs, getattr(train_iter, 'num_examples', None), mode)
    title = 'ResNet-18, Fashion-MNIST: %s, batch %d, lr %g' % (
        devices_mod.format_devices(devices), args.batch_size, args.lr)
    done = []

    def on_epoch(record):
        report.on_epoch(record)
        done.append(record)
        if metrics_file is not None:
            metrics_file.add_epoch(record)
        if args.plot:
            plotting.plot_history(done, args.plot, title=title, num_epochs=args.epochs)

    try:
        history = training.train(net, train_iter, test_iter, devices, lr=args.lr,
                                 num_epochs=args.epochs, seed=args.seed, verbose=False,
                                 on_batch=report.on_batch, on_epoch=on_epoch)
    finally:
        report.close()
    summary = metrics.summarize(history, devices)
    print(summary['line'], flush=True)
    if metrics_file is not None:
        metrics_file.finish(summary)
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
