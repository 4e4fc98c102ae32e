"""What every ``python -m gluon_mgpu.*`` command shares: flags, checks and the error ladder.

Bad input is one line on stderr and exit code 2 (``UsageError``, whose message is the whole
line; argparse's own errors become one through ``Parser``). ``run_command`` maps everything
else: 1 for a failed run (a diverged loss, replicas that differ, an unexpected error, which
suggests ``--debug``), 130 for Ctrl-C, 143 for SIGTERM, 129 for SIGHUP. Every failure is one line, written in one ``write`` so
that the processes of a dist job sharing a stream cannot split it; ``--debug`` (or
``GLUON_MGPU_DEBUG=1``) prints the traceback first.

No command module imports another: what two commands share lives here.
"""
import argparse
import math
import os
import sys
import traceback

from ..runtime import files
from ..handlers.interrupts import one_line

__all__ = ['UsageError', 'Parser', 'DEBUG_ENV', 'count', 'positive_float', 'seed',
           'learning_rate', 'output_file', 'weights', 'data_error', 'devices',
           'add_device_flag', 'add_data_flags', 'add_seed_flag', 'add_hybridize_flag',
           'add_dtype_flags', 'check_dtype', 'add_debug_flag',
           'debug_requested', 'one_line', 'unexpected', 'stopped_by', 'run_command']

DEBUG_ENV = 'GLUON_MGPU_DEBUG'
# The learning rates MXNet's SGD operators take: float32's normal range, 2**-126 to its largest
# value (measured with 1.9.1: sgd_update refuses 3.5e38 and 1.1e-38 as "Out of range value").
LR_RANGE = (2.0 ** -126, (2 - 2.0 ** -23) * 2.0 ** 127)


class UsageError(Exception):
    """Bad command-line input; the message is the whole line shown to the user."""


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one ``UsageError`` line pointing to ``--help``."""

    def error(self, message):
        raise UsageError('%s: error: %s (see --help)' % (self.prog, message))


# Value checks for ``type=``: each names the flag, the value and an example.

def _number(flag, text, convert, noun, example):
    try:
        return convert(text)
    except ValueError:
        raise argparse.ArgumentTypeError('%s expects %s, got %r; for example %s %s'
                                         % (flag, noun, text, flag, example)) from None


def count(flag):
    """A whole number of at least 1: ``--num-gpus``, ``--epochs``, ..."""
    def parse(text):
        value = _number(flag, text, int, 'a whole number', 2)
        if value < 1:
            raise argparse.ArgumentTypeError(
                '%s must be at least 1, got %d; for example %s 2' % (flag, value, flag))
        return value
    return parse


def positive_float(flag):
    """A finite number above 0: ``--lr``, ``--lr-per-device``."""
    def parse(text):
        value = _number(flag, text, float, 'a number', 0.1)
        if not value > 0 or value == float('inf'):
            raise argparse.ArgumentTypeError(
                '%s must be a finite number above 0, got %r; for example %s 0.1'
                % (flag, text, flag))
        return value
    return parse


def learning_rate(flag):
    """A learning rate MXNet's float32 optimizer can use: finite, above 0, a normal float32.

    ``1e39`` is finite as a double but infinite in float32, ``1e-320`` becomes 0; MXNet's
    ``sgd_update`` refuses both (inside its optimizer callback, where the error would be lost).
    """
    above_zero = positive_float(flag)

    def parse(text):
        value = above_zero(text)
        low, high = LR_RANGE
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(
                '%s %s is outside what MXNet\'s float32 optimizer can use (%.8g to %.8g); for '
                'example %s 0.1' % (flag, text, low, high, flag))
        return value
    return parse


def seed(text):
    """``--seed``: a whole number MXNet and numpy both accept."""
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


def output_file(flag, suffixes=None, example='run.json'):
    """A path the command may write (``files.output_problem``), ending in one of ``suffixes``."""
    def parse(text):
        path = os.path.expanduser(text)
        problem = files.output_problem(path)
        if problem:
            raise argparse.ArgumentTypeError('%s %s: %s' % (flag, text, problem))
        if suffixes and os.path.splitext(path)[1].lower() not in suffixes:
            raise argparse.ArgumentTypeError(
                '%s %s: the name must end in %s; for example %s %s'
                % (flag, text, ' or '.join(suffixes), flag, example))
        return path
    return parse


def weights(text):
    """``--device-weights 3,1``: finite numbers above 0, separated by commas."""
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


# Flags that several commands share.

def add_device_flag(parser):
    """``--device auto|gpu|cpu``, as ``get_devices`` reads it."""
    from ..devices import DEVICE_CHOICES
    parser.add_argument('--device', choices=DEVICE_CHOICES, default='auto',
                        help='auto: GPUs if there are enough, simulated CPU devices if there is '
                             'no GPU; gpu: GPUs or an error; cpu: CPU contexts (default: auto)')


def add_data_flags(parser):
    """``--data-dir``, ``--train-limit``, ``--test-limit``."""
    parser.add_argument('--data-dir', default=None,
                        help='folder with the four Fashion-MNIST IDX .gz files (default: '
                             'search $MXNET_HOME/datasets/fashion-mnist, then '
                             '/usr/share/datasets/fashion-mnist)')
    parser.add_argument('--train-limit', type=count('--train-limit'), default=None,
                        help='use only the first N training images (default: all 60000)')
    parser.add_argument('--test-limit', type=count('--test-limit'), default=None,
                        help='use only the first N test images (default: all 10000)')


def add_seed_flag(parser, help):
    parser.add_argument('--seed', type=seed, default=None, help=help)


def add_hybridize_flag(parser):
    parser.add_argument('--hybridize', action=argparse.BooleanOptionalAction, default=True,
                        help='compile the network into one graph (same results as imperative, '
                             '1.24x as fast on a 2-core CPU, docs/benchmarks.md); --no-hybridize '
                             'runs it line by line as the book does (default: hybridize)')


def add_dtype_flags(parser):
    from ..runtime.precision import DTYPES
    parser.add_argument('--dtype', choices=DTYPES, default='float32',
                        help='what the network computes in: float32 (the book) or bfloat16 '
                             "(MXNet's AMP casts convolutions and dense layers, the parameters "
                             'stay float32; about 1.6x as fast on a CPU with avx512_bf16, '
                             'docs/bf16.md) (default: float32)')
    parser.add_argument('--force-dtype', action='store_true',
                        help='train in bfloat16 even on a CPU without bfloat16 instructions, '
                             'where it is slower than float32 (default: refuse)')


def check_dtype(prog, dtype, devices, force):
    """``precision.check_dtype``: its refusal as the command's ``UsageError``, its notes
    printed as warning lines on stderr."""
    from ..runtime.precision import check_dtype as check
    try:
        notes = check(dtype, devices, force)
    except ValueError as e:
        raise UsageError('%s: error: --dtype %s: %s' % (prog, dtype, e)) from None
    for note in notes:
        print('%s: warning: --dtype %s: %s' % (prog, dtype, note), file=sys.stderr, flush=True)


def add_debug_flag(parser):
    parser.add_argument('--debug', action='store_true',
                        help='on an error, show the full traceback (for bug reports); the '
                             'environment variable %s=1 does the same' % DEBUG_ENV)


def data_error(prog, e, data_dir=None):
    """The ``UsageError`` for an error of ``load_data_fashion_mnist`` (a data or limit problem)."""
    from ..data import DataError, DataNotFoundError
    if isinstance(e, (DataError, DataNotFoundError)):
        flag = '' if data_dir is None else '--data-dir %s: ' % data_dir
        return UsageError('%s: error: %s%s' % (prog, flag, e))
    return UsageError('%s: error: %s' % (prog, str(e).replace('train_limit', '--train-limit')
                                         .replace('test_limit', '--test-limit')
                                         .replace('or None for all', 'or leave it out for all')))


def devices(prog, num_gpus, device):
    """``get_devices(num_gpus, device)``, with its refusal as the command's ``UsageError``."""
    from ..devices import get_devices
    try:
        return get_devices(num_gpus, device)
    except ValueError as e:
        raise UsageError('%s: error: --num-gpus %d --device %s: %s'
                         % (prog, num_gpus, device, e)) from None


# The error ladder.

def debug_requested(argv):
    """Whether to show tracebacks: ``--debug`` in ``argv`` or ``GLUON_MGPU_DEBUG`` set, not to 0."""
    return '--debug' in argv or os.environ.get(DEBUG_ENV, '') not in ('', '0')


def unexpected(prog, e, debug, context=''):
    """The one line for an unexpected error: its type and message, ``context``, a --debug hint."""
    hint = '' if debug else ('; rerun with --debug (or %s=1) for the full traceback, and '
                             'include it in a bug report' % DEBUG_ENV)
    return '%s: error: unexpected %s: %s%s%s' % (prog, type(e).__name__, one_line(e), context,
                                                 hint)


def _say(e, line, debug):
    if debug:
        traceback.print_exception(type(e), e, e.__traceback__)
    # One line, whatever a path or a message holds.
    line = line.replace('\r', '\\r').replace('\n', '\\n')
    try:
        sys.stderr.write(line + '\n')
        sys.stderr.flush()
    except (OSError, ValueError):  # after SIGHUP the terminal may be gone: the code still tells
        pass


def stopped_by(e):
    """How a run stopped by a signal says so: ``interrupted (Ctrl-C)``, ``terminated (SIGTERM)``,
    ``terminated (SIGHUP)``."""
    name = getattr(e, 'signal_name', 'SIGINT')
    return 'interrupted (Ctrl-C)' if name == 'SIGINT' else 'terminated (%s)' % name


def run_command(prog, argv, body, explain=None):
    """Run ``body()`` and return the command's exit code; every failure is one stderr line.

    Parameters
    ----------
    prog : str
        The command, as its lines name it (``python -m gluon_mgpu.train``).
    argv : list of str
        Its arguments (for ``--debug``).
    body : callable
        Does the work; returns the exit code of a run that ended without an exception (None
        for 0).
    explain : callable, optional
        ``explain(e)`` returns ``(code, line)`` for an exception the command words itself
        (a diverged loss, Ctrl-C with what was kept), or None for the default:
        ``UsageError`` 2, ``KeyboardInterrupt`` 130, anything else 1 as unexpected.
    """
    debug = debug_requested(argv)
    try:
        return body() or 0
    except (Exception, KeyboardInterrupt) as e:
        words = explain(e) if explain is not None else None
        if words is None:
            if isinstance(e, UsageError):
                words = 2, str(e)
            elif isinstance(e, KeyboardInterrupt):
                words = getattr(e, 'exit_code', 130), '%s: %s' % (prog, stopped_by(e))
            else:
                words = 1, unexpected(prog, e, debug)
        code, line = words
        _say(e, line, debug)
        return code
