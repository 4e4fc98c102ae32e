"""The environment variables MXNet parses itself, checked before MXNet starts, since MXNet aborts
the process on a value it cannot parse: ``check_environment`` names the variable, the value and
the fix (docs/devices.md, "Values MXNet would abort on").
"""
import os
import re

from .hosts import job_problem
from .threads import thread_limit

__all__ = ['THREAD_COUNTS', 'THREADS_PER_CORE', 'WHOLE_NUMBERS', 'ZERO_CRASHES', 'FLAGS',
           'NUMBERS', 'PYTHON_WHOLE_NUMBERS', 'ENGINES', 'NOT_NUMBERS', 'check_environment']

# The variables are those libmxnet.so 1.9.1 names (``strings libmxnet.so``) and its Python code
# reads with int(); their types come from MXNet's sources (dmlc::GetEnv's default), and which
# values end the process was measured (docs/devices.md). Thread counts: whole numbers from the
# least value given (None: any) to the most check_environment allows.
THREAD_COUNTS = {'OMP_NUM_THREADS': 1, 'MXNET_OMP_MAX_THREADS': 1,
                 'MXNET_CPU_WORKER_NTHREADS': 1, 'MXNET_CPU_PRIORITY_NTHREADS': 1,
                 'MXNET_GPU_WORKER_NTHREADS': 1, 'MXNET_GPU_COPY_NTHREADS': 1,
                 'MXNET_MP_WORKER_NTHREADS': 1, 'MXNET_MP_OPENCV_NUM_THREADS': 1,
                 'MXNET_KVSTORE_REDUCTION_NTHREADS': None,
                 'MXNET_USE_NUM_CORES_OPERATOR_TUNING': 0}
# Other whole numbers, with the least value MXNet survives (None: any).
WHOLE_NUMBERS = dict(MXNET_CPU_TEMP_COPY=1, MXNET_GPU_TEMP_COPY=1, MXNET_CPU_PARALLEL_RAND_COPY=1,
                     MXNET_GPU_PARALLEL_RAND_COPY=1)
WHOLE_NUMBERS.update(dict.fromkeys((
    'MXNET_EXEC_BULK_EXEC_MAX_NODE_TRAIN', 'MXNET_EXEC_BULK_EXEC_MAX_NODE_TRAIN_FWD',
    'MXNET_EXEC_BULK_EXEC_MAX_NODE_TRAIN_BWD', 'MXNET_EXEC_INPLACE_GRAD_SUM_CAP',
    'MXNET_KVSTORE_USETREE', 'MXNET_KVSTORE_BIGARRAY_BOUND', 'MXNET_KVSTORE_SERIAL_PUSH',
    'MXNET_KVSTORE_SLICE_THRESHOLD', 'MXNET_ENABLE_GPU_P2P', 'MXNET_CPU_PARALLEL_SIZE',
    'MXNET_MKLDNN_CACHE_NUM', 'MXNET_DISABLE_MKLDNN_FUSE_CONV_BN',
    'MXNET_DISABLE_MKLDNN_FUSE_CONV_RELU', 'MXNET_DISABLE_MKLDNN_FUSE_CONV_SUM',
    'MXNET_DISABLE_MKLDNN_CONV_OPT', 'MXNET_DISABLE_MKLDNN_FC_OPT',
    'MXNET_DISABLE_MKLDNN_TRANSFORMER_OPT', 'MXNET_MKLDNN_QFC_DYNAMIC_PARAMS',
    'MXNET_USE_MKLDNN_RNN', 'MXNET_RNN_USE_WEIGHT_CACHE', 'MXNET_PROFILER_MODE',
    'MXNET_PROFILER_AUTOSTART', 'MXNET_SUBGRAPH_VERBOSE', 'MXNET_QUANTIZATION_VERBOSE',
    'MXNET_BACKWARD_DO_MIRROR', 'MXNET_CUDNN_AUTOTUNE_DEFAULT')))
# Whole numbers whose 0 ends MXNet with SIGFPE (a division by it); any other value works.
ZERO_CRASHES = ('MXNET_KVSTORE_BIGARRAY_BOUND',)
# Flags: 0, 1, true or false, in any case, and nothing else (not even a blank).
FLAGS = ('MXNET_EXEC_BULK_EXEC_TRAIN', 'MXNET_EXEC_BULK_EXEC_INFERENCE', 'MXNET_MKLDNN_ENABLED',
         'MXNET_ENGINE_INFO', 'MXNET_KVSTORE_LOGTREE', 'MXNET_OUTPUT_TUNING_DATA',
         'MXNET_VERBOSE_TUNING_INFO', 'MXNET_DISABLE_MKLDNN_FUSE_FC_ELTWISE',
         'MXNET_DISABLE_MKLDNN_QEM_FLOAT_OUTPUT', 'MXNET_DISABLE_MKLDNN_QEM_FUSE_ALL',
         'MXNET_DISABLE_MKLDNN_QFC_FLOAT_OUTPUT', 'MXNET_DISABLE_MKLDNN_QFC_FUSE_ALL',
         'MXNET_DISABLE_MKLDNN_QTRANSFORMER_FLOAT_OUTPUT',
         'MXNET_DISABLE_MKLDNN_QTRANSFORMER_FUSE_ALL', 'MXNET_ELIMINATE_COMMON_EXPR',
         'MXNET_INFER_STORAGE_TYPE_VERBOSE_LOGGING', 'MXNET_MEM_PLAN_VERBOSE_LOGGING',
         'MXNET_EXEC_VERBOSE_LOGGING', 'MXNET_STORAGE_FALLBACK_LOG_VERBOSE',
         'MXNET_KVSTORE_DIST_ROW_SPARSE_VERBOSE', 'MXNET_SAFE_ACCUMULATION', 'MXNET_MKLDNN_DEBUG',
         'MXNET_MKLDNN_FORCE_FC_AB_FORMAT', 'MXNET_USE_FUSION', 'MXNET_CUDA_ALLOW_TENSOR_CORE',
         'MXNET_CUDA_TENSOR_OP_MATH_ALLOW_CONVERSION')
# Numbers (double).
NUMBERS = ('MXNET_TUNING_WEIGHT_SCALE',)
# Read by MXNet's Python code with int(), which also fails on an empty value; the least value
# each works with (None: any). A 0 batch of MXNET_UPDATE_AGGREGATION_SIZE never ends its loop.
PYTHON_WHOLE_NUMBERS = {'MXNET_UPDATE_ON_KVSTORE': None, 'MXNET_OPTIMIZER_AGGREGATION_SIZE': None,
                        'MXNET_UPDATE_AGGREGATION_SIZE': 1, 'MXNET_ENABLE_CYTHON': None,
                        'MXNET_ENFORCE_CYTHON': None}
# MXNET_ENGINE_TYPE: MXNet 1.9.1's engines (src/engine/engine.cc).
ENGINES = ('ThreadedEnginePerDevice', 'ThreadedEngine', 'ThreadedEnginePooled', 'NaiveEngine')
# The other MXNET_ names in libmxnet.so, which it reads as text or not at all: a subgraph
# backend's name, MXNET_USE_OPERATOR_TUNING (0, 1 or a list of operators), a profiler domain,
# and one named in a message only (the Python code reads it, PYTHON_WHOLE_NUMBERS).
NOT_NUMBERS = ('MXNET_ENGINE_TYPE', 'MXNET_SUBGRAPH_BACKEND', 'MXNET_USE_OPERATOR_TUNING',
               'MXNET_C_API', 'MXNET_UPDATE_ON_KVSTORE')

THREADS_PER_CORE = 8  # more spin waiting for each other (docs/devices.md)
# dmlc::GetEnv reads a whole number with std::istringstream, which skips the C locale's blanks
# (space, \t, \n, \v, \f, \r) before it, then allows only dmlc::isspace after it (the same
# without \v); ASCII digits only, a C int.
_INT = re.compile(r'[ \t\n\v\f\r]*([+-]?)0*([0-9]+)[ \t\n\f\r]*')
# A double (dmlc::stod): blanks before it (not \v), none after.
_NUMBER = re.compile(r'[ \t\n\f\r]*[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?')
_INT_MAX = 2 ** 31 - 1
_DOUBLE_MIN = 2.2250738585072014e-308  # below it (not 0), dmlc::stod says "Out of range"


def _c_int(value):
    found = _INT.fullmatch(value)
    # No C int, and Python's int() reads 4300 digits at most.
    if not found or len(found[2]) > 10 or abs(int(found[1] + found[2])) > _INT_MAX:
        raise ValueError(value)
    return int(found[1] + found[2])


def _whole(name, value, least, example, read=_c_int, fails='MXNet aborts on it'):
    try:
        number = read(value)
    except ValueError:
        raise ValueError('%s=%r is not a whole number, and %s; set it to a whole number, for '
                         'example %s=%s, or unset it' % (name, value, fails, name, example)
                         ) from None
    if least is not None and number < least:
        raise ValueError('%s=%r is below %d, and MXNet fails on it; set it to %d or more, for '
                         'example %s=%s, or unset it' % (name, value, least, least, name, example))
    return number


def _number_problem(value):
    if not _NUMBER.fullmatch(value):
        return 'is not a number'
    number = abs(float(value))
    if number > 1.7976931348623157e308 or 0 < number < _DOUBLE_MIN:
        return 'is out of the range of a double'
    return None


def check_environment(environ, cores=1):
    """Raise ``ValueError`` for the first MXNet variable that MXNet would abort or crash on,
    naming it, its value and the fix.

    Each value is read as MXNet reads it: by ``dmlc::GetEnv`` in C++ (ASCII digits and blanks
    only; an empty value is unset) or by ``int()`` in its Python code (``PYTHON_WHOLE_NUMBERS``,
    where an empty value fails). For a dist job's server or scheduler, whose ``import mxnet``
    joins the job, the ``DMLC_*`` variables too (``hosts.job_problem``).

    Parameters
    ----------
    environ : mapping
        The environment MXNet will read (``os.environ``).
    cores : int, default 1
        Usable cores: the ceiling of the thread counts, and the example in a message.
    """
    library = environ.get('MXNET_LIBRARY_PATH', '')
    if library and not (os.path.isabs(library) and os.path.isfile(library)):
        # MXNet would log a warning through the root logger (which then prefixes every later
        # warning with WARNING:<logger>:) and load another library than the one asked for.
        raise ValueError('MXNET_LIBRARY_PATH=%r is not %s, so MXNet would load its own library '
                         'instead of it; point it at a libmxnet.so by its absolute path, or unset '
                         'it' % (library, 'an existing file' if os.path.isabs(library)
                                 else 'an absolute path'))
    most, reason = THREADS_PER_CORE * cores, ('%d per usable core (more spin waiting for each '
                                              'other: docs/devices.md)' % THREADS_PER_CORE)
    limit, source = thread_limit()
    if limit is not None and limit // 2 < most:
        most, reason = limit // 2, 'half of the %d threads %s allows' % (limit, source)
    for name, least in THREAD_COUNTS.items():
        value = environ.get(name, '')
        if value != '' and _whole(name, value, least, cores) > most:
            raise ValueError('%s=%s is more threads than MXNet can use here: at most %d, %s; set '
                             'it to the number of cores, %s=%d, or unset it'
                             % (name, value.strip(' \t\n\v\f\r'), most, reason, name, cores))
    for name, least in WHOLE_NUMBERS.items():
        value = environ.get(name, '')
        if value != '' and _whole(name, value, least, 1) == 0 and name in ZERO_CRASHES:
            raise ValueError('%s=%r ends MXNet with SIGFPE (it divides by it); set it to 1 or '
                             'more, or unset it' % (name, value))
    for name in NUMBERS:
        value = environ.get(name, '')
        problem = value != '' and _number_problem(value)
        if problem:
            raise ValueError('%s=%r %s, and MXNet aborts on it; set it to a number, for example '
                             '%s=1, or unset it' % (name, value, problem, name))
    for name in FLAGS:
        value = environ.get(name, '')
        if value != '' and not (value.isascii() and value.lower() in ('0', '1', 'true', 'false')):
            raise ValueError('%s=%r is not a flag, and MXNet aborts on it; set it to 1 or 0, or '
                             'unset it' % (name, value))
    for name, least in PYTHON_WHOLE_NUMBERS.items():
        if name in environ:
            _whole(name, environ[name], least, 1, int, "MXNet's Python code fails on it (int())")
    engine = environ.get('MXNET_ENGINE_TYPE', '')
    if engine != '' and engine not in ENGINES:
        raise ValueError('MXNET_ENGINE_TYPE=%r is not an engine of MXNet 1.9.1, and MXNet fails '
                         'on it; set it to one of %s (names as written), or unset it for the '
                         'default, ThreadedEnginePerDevice' % (engine, ', '.join(ENGINES)))
    # Any DMLC_ROLE but worker (even an empty one) makes MXNet's import start a dist server or
    # scheduler, which waits for the job inside C++: a port it cannot reach, forever.
    if environ.get('DMLC_ROLE', 'worker') != 'worker':
        problem = job_problem(environ)
        if problem:
            raise ValueError(problem)
