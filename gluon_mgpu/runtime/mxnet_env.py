"""The environment variables MXNet parses itself, checked before MXNet starts, since MXNet aborts
the process on a value it cannot parse: ``check_environment`` names the variable, the value and
the fix (docs/devices.md, "Values MXNet would abort on").
"""
import re

from .threads import thread_limit

__all__ = ['THREAD_COUNTS', 'THREADS_PER_CORE', 'WHOLE_NUMBERS', 'FLAGS', 'NUMBERS', 'ENGINES',
           'check_environment', 'most_threads']

# Which variables MXNet 1.9.1 aborts on, and their types, was measured (docs/devices.md).
# Thread counts: whole numbers from 1 to most_threads().
THREAD_COUNTS = ('OMP_NUM_THREADS', 'MXNET_OMP_MAX_THREADS', 'MXNET_CPU_WORKER_NTHREADS',
                 'MXNET_CPU_PRIORITY_NTHREADS', 'MXNET_GPU_WORKER_NTHREADS',
                 'MXNET_GPU_COPY_NTHREADS', 'MXNET_MP_WORKER_NTHREADS',
                 'MXNET_MP_OPENCV_NUM_THREADS')
# Other whole numbers, with the least value MXNet survives (None: any).
WHOLE_NUMBERS = {'MXNET_CPU_TEMP_COPY': 1, 'MXNET_GPU_TEMP_COPY': 1,
                 'MXNET_CPU_PARALLEL_RAND_COPY': 1, 'MXNET_GPU_PARALLEL_RAND_COPY': 1,
                 'MXNET_EXEC_BULK_EXEC_MAX_NODE_TRAIN': None,
                 'MXNET_EXEC_BULK_EXEC_MAX_NODE_TRAIN_FWD': None,
                 'MXNET_EXEC_BULK_EXEC_MAX_NODE_TRAIN_BWD': None,
                 'MXNET_EXEC_INPLACE_GRAD_SUM_CAP': None, 'MXNET_KVSTORE_USETREE': None,
                 'MXNET_ENABLE_GPU_P2P': None, 'MXNET_CPU_PARALLEL_SIZE': None,
                 'MXNET_MKLDNN_CACHE_NUM': None, 'MXNET_DISABLE_MKLDNN_FUSE_CONV_BN': None,
                 'MXNET_DISABLE_MKLDNN_FUSE_CONV_RELU': None,
                 'MXNET_DISABLE_MKLDNN_FUSE_CONV_SUM': None, 'MXNET_DISABLE_MKLDNN_CONV_OPT': None,
                 'MXNET_DISABLE_MKLDNN_FC_OPT': None, 'MXNET_PROFILER_MODE': None,
                 'MXNET_PROFILER_AUTOSTART': None, 'MXNET_USE_NUM_CORES_OPERATOR_TUNING': None}
# Flags: 0, 1, true or false, in any case.
FLAGS = ('MXNET_EXEC_BULK_EXEC_TRAIN', 'MXNET_MKLDNN_ENABLED', 'MXNET_ENGINE_INFO',
         'MXNET_KVSTORE_LOGTREE', 'MXNET_OUTPUT_TUNING_DATA', 'MXNET_VERBOSE_TUNING_INFO',
         'MXNET_DISABLE_MKLDNN_FUSE_FC_ELTWISE', 'MXNET_ELIMINATE_COMMON_EXPR',
         'MXNET_INFER_STORAGE_TYPE_VERBOSE_LOGGING', 'MXNET_MEM_PLAN_VERBOSE_LOGGING',
         'MXNET_MKLDNN_DEBUG', 'MXNET_MKLDNN_FORCE_FC_AB_FORMAT')
# Numbers (double).
NUMBERS = ('MXNET_TUNING_WEIGHT_SCALE',)
# MXNET_ENGINE_TYPE: MXNet 1.9.1's engines (src/engine/engine.cc).
ENGINES = ('ThreadedEnginePerDevice', 'ThreadedEngine', 'ThreadedEnginePooled', 'NaiveEngine')

THREADS_PER_CORE = 8  # more spin waiting for each other (docs/devices.md)
_INT = re.compile(r'\s*[+-]?[0-9]+\s*')
_NUMBER = re.compile(r'\s*[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?\s*')
_INT_MAX = 2 ** 31 - 1


def most_threads(cores):
    """``(n, reason)``: the most threads the package lets MXNet use on ``cores`` usable cores,
    ``THREADS_PER_CORE`` per core and at most half of ``threads.thread_limit()``."""
    most, reason = THREADS_PER_CORE * cores, (
        '%d per usable core (more spin waiting for each other: on 2 cores a step took 3.5x as '
        'long with 32, and never ended with 1000)' % THREADS_PER_CORE)
    limit, source = thread_limit()
    if limit is not None and limit // 2 < most:
        most, reason = limit // 2, 'half of the %d threads %s allows' % (limit, source)
    return most, reason


def _whole(name, value, least, example):
    if not _INT.fullmatch(value) or abs(int(value)) > _INT_MAX:
        raise ValueError('%s=%r is not a whole number, and MXNet aborts on it; set it to a whole '
                         'number, for example %s=%s, or unset it' % (name, value, name, example))
    number = int(value)
    if least is not None and number < least:
        raise ValueError('%s=%r is below %d, and MXNet fails on it; set it to %d or more, for '
                         'example %s=%s, or unset it' % (name, value, least, least, name, example))
    return number


def check_environment(environ, cores=1):
    """Raise ``ValueError`` for the first MXNet variable that MXNet would abort or crash on,
    naming it, its value and the fix.

    Parameters
    ----------
    environ : mapping
        The environment MXNet will read (``os.environ``).
    cores : int, default 1
        Usable cores, for the example in a message.
    """
    for name in THREAD_COUNTS:
        value = environ.get(name, '')
        if value == '':
            continue
        number = _whole(name, value, 1, cores)
        most, reason = most_threads(cores)
        if number > most:
            raise ValueError('%s=%s is more threads than MXNet can use here: at most %d, %s; set '
                             'it to the number of cores, %s=%d, or unset it'
                             % (name, value.strip(), most, reason, name, cores))
    for name, least in WHOLE_NUMBERS.items():
        value = environ.get(name, '')
        if value != '':
            _whole(name, value, least, 1 if least is None else max(least, 1))
    for name in NUMBERS:
        value = environ.get(name, '')
        if value != '' and not _NUMBER.fullmatch(value):
            raise ValueError('%s=%r is not a number, and MXNet aborts on it; set it to a number, '
                             'for example %s=1, or unset it' % (name, value, name))
    for name in FLAGS:
        value = environ.get(name, '')
        if value != '' and value.lower() not in ('0', '1', 'true', 'false'):
            raise ValueError('%s=%r is not a flag, and MXNet aborts on it; set it to 1 or 0, or '
                             'unset it' % (name, value))
    engine = environ.get('MXNET_ENGINE_TYPE', '')
    if engine != '' and engine not in ENGINES:
        raise ValueError('MXNET_ENGINE_TYPE=%r is not an engine of MXNet 1.9.1, and MXNet fails '
                         'on it; set it to one of %s (names as written), or unset it for the '
                         'default, ThreadedEnginePerDevice' % (engine, ', '.join(ENGINES)))
