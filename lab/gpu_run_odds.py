"""How often the published GPU runs draw as low as ours: exact odds from
docs/records/book-gpu-runs.csv.

The page's verdicts compare a mean over a few seeds with the GPU runs' range. When our runs read
low, the question is how often the GPU runs would: this counts it exactly, over every draw with
replacement, from the later MXNet editions' runs of one setting and epoch, grouped as the page's
table groups them (``book_records.read_gpu_runs``; on 2 GPUs their measure splits the test set
over the GPUs, each with its own statistics, as our train command does).

    .venv/bin/python lab/gpu_run_odds.py --devices 2 --epoch 1 \\
        --ours 0.7996 0.7249 0.7935 0.7264 0.7499 0.5872

prints how often as many later-edition runs average at most our mean and, with ``--below Y``,
how often as many of them hold at least as many values below Y as ours do.
"""
import argparse
import csv
import sys
from fractions import Fraction
from math import comb, prod

import numpy as np

import book_records  # the GPU runs as the page's table groups them (read_gpu_runs)
from gluon_mgpu import Parser, UsageError, run_command

PROG = 'lab/gpu_run_odds.py'


def mean_at_most(values, n, x):
    """Probability that ``n`` draws with replacement from ``values`` average at most ``x``,
    exact: the values are counted in thousandths and the sum's distribution convolved."""
    ticks = [round(v * 1000) for v in values]
    return sum_at_most([ticks] * n, int(np.floor(x * 1000 * n + 1e-9)))


def sum_at_most(groups, limit):
    """Probability that one draw from each of ``groups`` (lists of whole numbers from 0, each
    equally likely) sums to at most ``limit``, exact: the sum's distribution is convolved."""
    total = np.array([1], dtype=object)  # exact integer counts
    for group in groups:
        total = np.convolve(total, np.bincount(group).astype(object))
    return Fraction(int(total[:max(limit + 1, 0)].sum()), prod(len(g) for g in groups))


def at_least_below(values, n, k, y):
    """Probability that ``n`` draws with replacement from ``values`` hold ``k`` or more below
    ``y``."""
    p = Fraction(sum(v < y for v in values), len(values))
    return sum(comb(n, i) * p ** i * (1 - p) ** (n - i) for i in range(k, n + 1))


def _accuracy(text):
    try:
        value = float(text)
    except ValueError:
        value = None
    if value is None or not 0 <= value <= 1:
        raise argparse.ArgumentTypeError('an accuracy is a number from 0 to 1, got %r; for '
                                         'example 0.8396' % text)
    return value


def main(argv=None):
    """Print the odds; return the exit code: bad input is one line and 2, stdout that cannot
    be written ends as a Unix tool ends (``run_command``)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    return run_command(PROG, argv, lambda: _odds(argv))


def _odds(argv):
    p = Parser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument('--devices', type=int, choices=(1, 2), required=True)
    p.add_argument('--epoch', type=int, choices=(1, 2, 3, 4), required=True)
    p.add_argument('--ours', type=_accuracy, nargs='+', required=True, metavar='ACC',
                   action='extend', help="our runs' test accuracies by the same measure (a "
                                         'second --ours adds to the first)')
    p.add_argument('--below', type=_accuracy, metavar='Y',
                   help='also count the values below Y')
    args = p.parse_args(argv)
    try:
        runs = book_records.read_gpu_runs(book_records.GPU_RUNS).get(
            ('later', args.devices, args.epoch))
    except (OSError, ValueError, csv.Error) as e:  # InputError, UnicodeDecodeError included
        raise UsageError('%s cannot be read (%s); restore it: git checkout %s'
                         % (book_records.GPU_RUNS, '%s: %s' % (type(e).__name__, str(e)[:200]),
                            book_records.GPU_RUNS)) from None
    if not runs:
        raise UsageError('%s holds no later-edition run on %d device(s) at epoch %d; restore '
                         'it: git checkout %s' % (book_records.GPU_RUNS, args.devices,
                                                  args.epoch, book_records.GPU_RUNS))
    n, mean = len(args.ours), sum(args.ours) / len(args.ours)
    print('%d later-edition runs, %d device(s), epoch %d; ours: %d runs, mean %.4f'
          % (len(runs), args.devices, args.epoch, n, mean))
    print('%d of them average at most %.4f: %.1f%% of all %d^%d draws'
          % (n, mean, 100 * float(mean_at_most(runs, n, mean)), len(runs), n))
    if args.below is not None:
        k = sum(v < args.below for v in args.ours)
        print('below %.3f: %d of ours, %d of the %d runs; %d draws hold %d or more: %.1f%%'
              % (args.below, k, sum(v < args.below for v in runs), len(runs), n, k,
                 100 * float(at_least_below(runs, n, k, args.below))))


if __name__ == '__main__':
    sys.exit(main())
