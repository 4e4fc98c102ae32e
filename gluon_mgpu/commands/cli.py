"""What the ``python -m gluon_mgpu.*`` commands share (no command module imports another):
flags, value checks and ``run_command``, one stderr line and an exit code for every failure
(docs/outputs.md, "When a command fails").
"""
import argparse
import errno
import math
import os
import re
import signal
import sys
import traceback

from ..runtime import choices, files, startup
from ..runtime.checks import LR_RANGE, one_line

DEBUG_ENV = 'GLUON_MGPU_DEBUG'
# The book's batch size and learning rate per device (training.BATCH_SIZE_PER_DEVICE and
# LR_PER_DEVICE; tests/test_cli.py checks they agree), here so that parsers import no MXNet.
BOOK_PER_DEVICE = (256, 0.1)


class UsageError(Exception):
    """Bad command-line input; ``run_command`` shows it as ``error_line(prog, message)``."""


class CommandError(Exception):
    """A failure a command words itself (a run it started failed, its kernel died): its
    message as ``error_line`` shows it, exit code 1."""


def error_line(prog, message):
    """The line of every failure: ``python -m gluon_mgpu.<command>: error: <message>``."""
    return '%s: error: %s' % (prog, message)


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one ``UsageError`` line pointing to ``--help``,
    and which lists what it reads, as a resume merging two command lines needs it: ``settings``,
    each flag's action in order (``--help`` aside), and ``exclusive``, the actions of each
    mutually exclusive group. Its static methods are the commands' value types
    (``type=Parser.whole('--epochs')``), its ``add_*`` methods the flags they share."""

    def __init__(self, *args, **kwargs):
        self.settings, self.exclusive = [], []
        super().__init__(*args, **kwargs)

    def add_argument(self, *args, **kwargs):
        action = super().add_argument(*args, **kwargs)
        if action.dest != 'help':
            self.settings.append(action)
        return action

    def add_mutually_exclusive_group(self, **kwargs):
        group, members = super().add_mutually_exclusive_group(**kwargs), []
        self.exclusive.append(members)

        def add_argument(*args, add=group.add_argument, **kwargs):
            members.append(add(*args, **kwargs))
            self.settings.append(members[-1])
            return members[-1]
        group.add_argument = add_argument
        return group

    def error(self, message):
        # Python 3.12.8 and 3.13.1 on print an invalid choice's list unquoted: quoted on every
        # Python, as 3.9 to 3.11 print it, so the line is the same wherever it runs.
        message = re.sub(r'(: invalid choice: .*\(choose from )([^)]*)\)$', lambda m: '%s%s)' % (
            m[1], ', '.join(c if c[:1] == "'" else repr(c) for c in m[2].split(', '))), message)
        raise UsageError('%s (see --help)' % message)

    @staticmethod
    def whole(flag, minimum=1, maximum=None, example=2):
        """A whole number from ``minimum`` (to ``maximum``; at most a C int, as MXNet's counts
        are): ``--epochs``, ``--port``, ``--seed``."""
        def parse(text):
            digits = re.fullmatch(r'\s*([-+]?)0*([0-9]+)\s*', text)  # int() reads 4300 at most
            try:
                value = int(digits[1] + digits[2][:21]) if digits else int(text)
            except ValueError:
                raise _refuse(flag, 'expects a whole number, got %r' % text[:40], example) from None
            shown = value if abs(value) < 10 ** 20 else 'a number of %d digits' % (
                len(digits[2]) if digits else len(str(abs(value))))  # '1_0...', '٣...': int() read
            if maximum is not None and not minimum <= value <= maximum:
                raise _refuse(flag, 'must be between %d and %d, got %s' % (minimum, maximum, shown),
                              example)
            if value < minimum:
                raise _refuse(flag, 'must be at least %d, got %s' % (minimum, shown), example)
            if value > 2 ** 31 - 1:
                raise _refuse(flag, 'must be at most %d, got %s' % (2 ** 31 - 1, shown), example)
            return value
        return parse

    @staticmethod
    def positive_float(flag, example=0.1, noun=None):
        """A finite number above 0; with ``noun``, both refusals say ``FLAG expects NOUN``."""
        def parse(text):
            try:
                value = float(text)
            except ValueError:
                value = None
            if value is not None and 0 < value < math.inf:
                return value
            if noun is None and value is not None:
                raise _refuse(flag, 'must be a finite number above 0, got %r' % text, example)
            raise _refuse(flag, 'expects %s, got %r' % (noun or 'a number', text), example)
        return parse

    @staticmethod
    def learning_rate(flag):
        """A learning rate in ``LR_RANGE``: ``1e39`` is infinite in float32, ``1e-320`` is 0, and
        ``sgd_update`` would refuse them in the middle of a step."""
        above_zero = Parser.positive_float(flag)

        def parse(text):
            value = above_zero(text)
            low, high = LR_RANGE
            if not low <= value <= high:
                raise _refuse(flag, '%s is outside what MXNet\'s float32 optimizer can use '
                                    '(%.8g to %.8g)' % (text, low, high), 0.1)
            return value
        return parse

    @staticmethod
    def output_file(flag, example='run.json'):
        """A path of a file the command writes; whether it may be written, and its name's ending,
        are checked once it is resolved (``check_output``), never while parsing."""
        def parse(text):
            _empty(flag, text, example)
            return os.path.expanduser(text)
        return parse

    @staticmethod
    def check_output(flag, path, mxnet=False, suffixes=None, example='run.json'):
        """``UsageError`` for an output ``path`` the command may not write
        (``files.output_problem``; with ``mxnet``, one MXNet's own writer would not open as
        Python does, ``files.mxnet_path_problem``), or whose name does not end in one of
        ``suffixes``."""
        problem = files.output_problem(path) or (mxnet and files.mxnet_path_problem(path))
        if problem:
            raise UsageError('argument %s: %s %s: %s (see --help)' % (flag, flag, shown(path),
                                                                      problem))
        if suffixes and os.path.splitext(path)[1].lower() not in suffixes:
            raise UsageError('argument %s: %s (see --help)' % (flag, _refuse(flag, '%s: the name '
                             'must end in %s' % (shown(path), ' or '.join(suffixes)), example)))

    @staticmethod
    def output_folder(flag, example='runs/a', mxnet=True):
        """A folder the command writes into (made if missing): not empty, no NUL; with ``mxnet``
        (MXNet's own writers write there), a path MXNet opens as Python does
        (``files.mxnet_path_problem``)."""
        def parse(text):
            _empty(flag, text, example)
            path = os.path.expanduser(text)
            problem = ('it contains a NUL character; name a folder without one' if '\0' in path
                       else mxnet and files.mxnet_path_problem(path))
            if problem:
                raise argparse.ArgumentTypeError('%s %s: %s' % (flag, shown(text), problem))
            return path
        return parse

    @staticmethod
    def weights(text):
        """``--device-weights 3,1``: finite numbers above 0, separated by commas."""
        try:
            values = [float(v) for v in text.split(',')]
        except ValueError:
            raise _refuse('--device-weights', 'expects numbers separated by commas, got %r' % text,
                          '3,1') from None
        if not all(math.isfinite(v) and v > 0 for v in values):
            raise _refuse('--device-weights', 'must all be finite numbers above 0, got %r' % text,
                          '3,1')
        return values

    def add_device_flag(self):
        """``--device auto|gpu|cpu``, as ``get_devices`` reads it."""
        self.add_argument('--device', choices=choices.DEVICES, default='auto',
                          help='auto: GPUs if there are enough, simulated CPU devices if there '
                               'is no GPU; gpu: GPUs or an error; cpu: CPU contexts (default: '
                               'auto)')

    def add_data_flags(self):
        """``--data-dir``, ``--train-limit``, ``--test-limit``."""
        self.add_argument('--data-dir',
                          help='folder with the four Fashion-MNIST IDX .gz files (default: '
                               'search $MXNET_HOME/datasets/fashion-mnist, then '
                               '/usr/share/datasets/fashion-mnist)')
        self.add_argument('--train-limit', type=Parser.whole('--train-limit'),
                          help='use only the first N training images (default: all 60000)')
        self.add_argument('--test-limit', type=Parser.whole('--test-limit'),
                          help='use only the first N test images (default: all 10000)')

    def add_seed_flag(self, help):
        # MXNet's seed is a C int; numpy's generator refuses negative seeds.
        self.add_argument('--seed', type=Parser.whole('--seed', 0, 2 ** 31 - 1, example=0),
                          help=help)

    def add_hybridize_flag(self):
        self.add_argument('--hybridize', action=argparse.BooleanOptionalAction, default=True,
                          help='compile the network into one graph (the same results as '
                               'imperative, faster: docs/benchmarks.md); --no-hybridize runs it '
                               'line by line as the book does (default: hybridize)')

    def add_dtype_flags(self):
        self.add_argument('--dtype', choices=choices.DTYPES, default='float32',
                          help='what the network computes in: float32 (the book) or bfloat16 '
                               "(MXNet's AMP casts convolutions and dense layers, the parameters "
                               'stay float32; faster on a CPU with avx512_bf16, docs/bf16.md) '
                               '(default: float32)')
        self.add_argument('--force-dtype', action='store_true',
                          help='train in bfloat16 even on a CPU without bfloat16 instructions, '
                               'where it is slower than float32 (default: refuse)')

    def add_debug_flag(self):
        self.add_argument('--debug', action='store_true',
                          help='on an error, show the full traceback (for bug reports); the '
                               'environment variable %s=1 does the same' % DEBUG_ENV)


def _refuse(flag, what, example):  # a value check's refusal names the flag and an example
    return argparse.ArgumentTypeError('%s %s; for example %s %s' % (flag, what, flag, example))


def shown(path):
    """``path`` as a message shows it: a byte the locale cannot decode as ``\\xff``."""
    return os.fsencode(path).decode(sys.getfilesystemencoding(), 'backslashreplace')


def _empty(flag, text, example):
    if not text.strip():  # an unset variable in a script: '' would mean the current folder
        raise _refuse(flag, 'is empty (%r; an unset variable?)' % text, example)


# What MXNet 1.9.1 says when memory runs out (libmxnet.so's strings): on the CPU, on a GPU.
OUT_OF_MEMORY = ('Failed to allocate CPU Memory', 'cudaMalloc retry failed',
                 'cudaMalloc failed: out of memory')


def out_of_memory(e):
    """What ``e`` says if it is memory running out (MXNet's words, or Python's ``MemoryError``),
    else None."""
    if isinstance(e, MemoryError):
        return 'MemoryError'
    text = one_line(e)
    return text if any(words in text for words in OUT_OF_MEMORY) else None


def _say(e, line, debug):
    if debug:
        traceback.print_exception(type(e), e, e.__traceback__)
    line = line.replace('\r', '\\r').replace('\n', '\\n')  # one line, whatever a message holds
    try:
        sys.stderr.write(line + '\n')
        sys.stderr.flush()
    except (OSError, ValueError):  # after SIGHUP the terminal may be gone: the code still tells
        pass


class StdoutError(Exception):
    """Standard output cannot be written: its reader is gone (``errno.EPIPE``, ``head -1``) or
    the operating system refused the write (``errno.ENOSPC`` for ``>/dev/full``). Not an
    ``OSError``, so that nothing on the way (argparse's ``--help``) takes it for its own."""

    def __init__(self, error):
        self.errno = error.errno
        self.strerror = error.strerror or str(error)
        super().__init__(self.strerror)


class _WatchedStdout:
    """``sys.stdout`` while a command runs: a write or flush that fails raises ``StdoutError``."""

    def __init__(self, stream):
        self._stream = stream

    def __getattr__(self, name):
        found = getattr(self._stream, name)
        if name not in ('write', 'flush'):
            return found

        def watched(*args):
            try:
                return found(*args)
            except OSError as e:
                raise StdoutError(e) from None
        return watched


def _in_optimizer(e):
    """Whether ``e`` came out of MXNet's optimizer package (``trainer.step`` updating), as its
    traceback says."""
    import mxnet
    where = os.path.dirname(mxnet.optimizer.__file__) + os.sep
    return any(f.filename.startswith(where) for f in traceback.extract_tb(e.__traceback__))


def _out_of_memory(flag, size, devices):
    """The fix of memory that ran out with ``flag size`` over ``devices`` (see ``failure``)."""
    n, simulated = devices or (1, 0)
    fix = 'pass a smaller %s, for example %s %d' % (flag, flag, max(n, size // 2))
    if simulated > 1:  # every simulated device holds a replica: fewer free the most
        fix = ('each simulated device holds a replica of the network: pass fewer devices, for '
               'example --num-gpus %d%s' % (simulated // 2, ', or a smaller %s, for example %s '
                                            '%d' % (flag, flag, size // 2)
                                            if size // 2 >= n else ''))
    return ' with %s %d%s; %s' % (flag, size, ' over %d device(s)' % n if devices else '', fix)


def failure(prog, e, debug=False, saved=None, where='', lr=None, batch=None, devices=None,
            horovod=False):
    """The one table of a command's failures: ``(exit code, line)`` for the exception ``e``.

    A command supplies what it kept, ``saved(e, why)``: the clause after the failure (``'; the
    checkpoint of epoch 2 ... is complete'``, or ``''``), ``why`` naming the failure in a few
    words (None: bad input). The fixes name its flags: ``lr`` and ``batch`` as ``(flag,
    value)``, ``devices`` as ``(count, simulated devices per process)``; ``where`` the run
    stood (``' in the 2-device setting'``); ``horovod``: a Horovod job, whose lost peer is named.
    """
    def raised(module, name):  # nothing is imported here: a bad flag never starts MXNet
        found = sys.modules.get('gluon_mgpu.' + module)
        return found is not None and isinstance(e, getattr(found, name))
    if horovod:
        from ..runtime.horovod import PEER_GONE
    memory = out_of_memory(e)
    table = (  # (whether e is this failure, why, its line but for what was kept)
        (isinstance(e, UsageError), None, lambda: str(e)),
        (isinstance(e, FileNotFoundError) and e.filename is None and os.stat('.').st_nlink == 0,
         None, lambda: 'the folder this command runs in was deleted, so no relative path names '
                       'a file; cd into a folder that exists and run the command again'),
        (isinstance(e, KeyboardInterrupt),  # startup.Interrupted names its signal
         getattr(e, 'words', 'interrupted (Ctrl-C)'), lambda: where),
        (lr and 'mxnet' in sys.modules and _in_optimizer(e), 'an error', lambda: (
            'the optimizer failed inside trainer.step%s: %s: %s; the step was not completed, so '
            'training stops (%s %g)' % (where, type(e).__name__, one_line(e), *lr))),
        (isinstance(e, (files.OutputError, CommandError))
         or raised('handlers.checkpoint', 'CheckpointError'), 'an error', lambda: str(e)),
        (lr and raised('handlers.events', 'LossNotFiniteError'), 'training diverged', lambda: (
            'the training loss became %s at epoch %s, step %d%s with learning rate %g: training '
            'diverged; start again with a smaller learning rate, for example %s %g'
            % (e.loss, e.epoch, e.step, where, e.lr, lr[0], lr[1] / 10))),
        (raised('handlers.replica_check', 'ReplicaCheckFailed'), 'an error',
         lambda: '--check-replicas: %s' % e),
        (memory and batch, 'out of memory',
         lambda: 'out of memory (%s)%s%s' % (memory, where, _out_of_memory(*batch, devices))),
        (horovod and any(text in str(e) for text in PEER_GONE), 'an error', lambda: (
            'another process of the Horovod job stopped, so this one cannot go on (horovodrun '
            'names it)')),
    )
    for found, why, line in table:
        if found:
            kept = saved(e, why) if saved else ''
            if isinstance(e, KeyboardInterrupt):
                return getattr(e, 'exit_code', 130), '%s: %s%s%s' % (prog, why, line(), kept)
            return 2 if why is None else 1, error_line(prog, line() + kept)
    kept = saved(e, 'unexpected %s' % type(e).__name__) if saved else ''
    hint = '' if debug else ('; rerun with --debug (or %s=1) for the full traceback, and '
                             'include it in a bug report' % DEBUG_ENV)
    return 1, error_line(prog, 'unexpected %s: %s%s%s%s' % (
        type(e).__name__, one_line(e), ' (%s)' % where.strip() if where else '', kept, hint))


def run_command(prog, argv, body, story=None, leave=None):
    """Return ``body()`` (None: 0) as the exit code; every failure is one stderr line.

    A failure is worded by the one table, ``failure``; ``story(e)``, if given, returns what
    the command adds to it (its keyword arguments: what the run kept, the flags a fix names).
    Without one: ``UsageError`` 2, ``KeyboardInterrupt`` 130, else 1. ``--debug`` in ``argv``
    (or ``GLUON_MGPU_DEBUG``) adds the traceback. Standard output that cannot be written ends
    the command as a Unix tool ends: quietly with 141 when its reader is gone (``| head -1``),
    else with one line naming stdout and 1 (``>/dev/full``), never with a traceback.
    A stream closed when the command started (``>&-``) is as ``print`` takes it: what would be
    written to it goes nowhere. ``leave(e)``, if given, is asked of every failure ``e``: true
    ends the process right after its line (``os._exit``), as a failed worker of a dist job must
    (a normal exit would wait at MXNet's final barrier for the others) and one whose memory ran
    out should (MXNet's engine may hold half-made arrays: its exit handlers crashed, 'double
    free or corruption').
    """
    debug = '--debug' in argv or os.environ.get(DEBUG_ENV, '') not in ('', '0')
    for name in ('stdout', 'stderr'):  # closed when Python started (>&-, 2>&-): as print() does
        if getattr(sys, name) is None:  # then, what would be printed goes nowhere; the code tells
            setattr(sys, name, open(os.devnull, 'w'))
    stream, failed = sys.stdout, None
    sys.stdout = _WatchedStdout(stream)
    try:
        try:
            code = body() or 0
            sys.stdout.flush()
        except SystemExit:  # argparse's --help: its text reaches stdout, or this says why
            sys.stdout.flush()
            raise
        except StdoutError:
            raise
        except (Exception, KeyboardInterrupt) as e:
            failed = e
            code, line = failure(prog, e, debug, **(story(e) if story else {}))
            sys.stdout.flush()  # what the story printed (a sweep's finished rows) comes first
            _say(e, line, debug)
    except StdoutError as e:  # a broken pipe ends quietly, 128 + SIGPIPE as a shell shows it
        try:  # what is still buffered goes nowhere, so that Python's flush at exit is quiet too
            fd = os.open(os.devnull, os.O_WRONLY)
            os.dup2(fd, stream.fileno())
            os.close(fd)
        except (AttributeError, OSError, ValueError):  # not a file (a test's stream)
            pass
        failed, code = failed or e, 128 + signal.SIGPIPE if e.errno == errno.EPIPE else 1
        if code == 1:
            _say(e, error_line(prog, 'cannot write to stdout (%s); %s' % (
                e.strerror, files.write_hint(e.errno, 'send the output elsewhere'))), debug)
    finally:
        if isinstance(sys.stdout, _WatchedStdout):
            sys.stdout = stream
    if failed is not None and leave is not None and leave(failed):
        os._exit(code)
    return code


def die_with(parent, signum):
    """Have this process get ``signum`` when process ``parent`` ends, even by SIGKILL (Linux's
    ``prctl(PR_SET_PDEATHSIG)``; elsewhere nothing): in its child, or as the ``preexec_fn``."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signum)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # it ended before prctl took effect
        os.kill(os.getpid(), signum)


def run_report(prog, argv, parse, run, before):
    """``run_command`` of a command that prints a report and writes no file: ``parse(argv)``
    before MXNet starts, then ``run(args)``; a signal's line says it stopped ``before`` (``'before
    the table was printed'``) and lost nothing."""
    stopped = before + '; it writes no file, so nothing was lost'

    def body():
        args = parse(argv)
        startup.before_mxnet(prog)  # threads, checks, then MXNet
        from ..handlers.interrupts import DeferredInterrupt
        # A signal deferred in a __del__, or waiting inside MXNet (the book's Trainer updates in
        # its optimizer callback), ends the command within a second.
        with DeferredInterrupt(), startup.interruptible(prog, stopped):
            return run(args)

    return run_command(prog, argv, body, lambda e: {'saved': lambda e, why: ' ' + stopped
                                                    if isinstance(e, KeyboardInterrupt) else ''})
