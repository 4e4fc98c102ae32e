"""bfloat16 training as an option beside the book's float32, through MXNet's AMP. AMP is
process-wide in MXNet 1.9.1, so ``use_dtype`` guards the switch, and ``check_dtype`` refuses a CPU
that would only emulate bfloat16. docs/precision.md explains it.
"""
from ..devices import cpu_flags

__all__ = ['DTYPES', 'BF16_CPU_FLAGS', 'check_dtype', 'use_dtype', 'active_dtype',
           'init_trainer']

DTYPES = ('float32', 'bfloat16')
BF16_CPU_FLAGS = ('avx512_bf16', 'amx_bf16')
# oneDNN's avx512_core: without it MXNet 1.9.1 has no bfloat16 convolution (docs/precision.md).
AVX512_CORE_FLAGS = ('avx512f', 'avx512bw', 'avx512vl', 'avx512dq')

# What this process computes in: None until a network is built through use_dtype.
_state = {'dtype': None}


def _checked(dtype):
    if dtype not in DTYPES:
        raise ValueError('dtype must be one of %s, got %r; for example dtype=\'bfloat16\''
                         % (', '.join(DTYPES), dtype))
    return dtype


def check_dtype(dtype, devices, force=False, flags=None, fix=None):
    """Check that ``devices`` can train in ``dtype``; return the notes to show (lines).

    Parameters
    ----------
    dtype : {'float32', 'bfloat16'}
    devices : list of mxnet.Context
    force : bool, default False
        Train in bfloat16 on a CPU without bfloat16 instructions anyway (slower than float32).
    flags : set of str, optional
        The CPU's feature flags; default ``devices.cpu_flags()``.
    fix : str, optional
        What a refusal tells the caller to do, after its reason and a ';'; default: train in
        float32 (or force, where forcing would run).

    Returns
    -------
    list of str
        One line for a GPU (never run here), one for a forced CPU without ``BF16_CPU_FLAGS``.

    Raises
    ------
    ValueError
        For an unknown dtype; bfloat16 on a CPU without bfloat16 instructions unless
        ``force``; bfloat16 on a CPU without AVX-512 even then.
    """
    if _checked(dtype) == 'float32':
        return []
    notes = []
    if any(d.device_type == 'gpu' for d in devices):
        notes.append('bfloat16 on a GPU was never run here (only on CPUs with avx512_bf16); '
                     'compare its accuracy with a float32 run before trusting it')
    if any(d.device_type == 'cpu' for d in devices):
        flags = cpu_flags() if flags is None else set(flags)
        if not flags & set(BF16_CPU_FLAGS) and not set(AVX512_CORE_FLAGS) <= flags:
            raise ValueError('this CPU has neither %s nor AVX-512 (%s) in /proc/cpuinfo, and '
                             'MXNet\'s oneDNN has no bfloat16 convolution for it: training '
                             'would stop at its first step; %s'
                             % (' nor '.join(BF16_CPU_FLAGS), ', '.join(AVX512_CORE_FLAGS),
                                fix or 'train in float32'))
        if not flags & set(BF16_CPU_FLAGS):
            why = ('this CPU has neither %s in /proc/cpuinfo, so oneDNN would emulate '
                   'bfloat16, slower than float32' % ' nor '.join(BF16_CPU_FLAGS))
            if not force:
                raise ValueError('%s; %s' % (why, fix or 'train in float32, or force bfloat16 '
                                             'anyway (--force-dtype, force_dtype=True)'))
            notes.append('%s (forced)' % why)
    return notes


def active_dtype():
    """What the networks of this process compute in: ``'float32'``, ``'bfloat16'``, or None
    before ``use_dtype``."""
    return _state['dtype']


def use_dtype(dtype):
    """Make this process compute in ``dtype`` (bfloat16: ``amp.init``, once); call it before
    building a network. RuntimeError when it already computes in the other dtype (MXNet 1.9.1
    cannot undo ``amp.init``), or when MXNet's AMP was started by someone else."""
    from mxnet.contrib import amp
    active = _state['dtype']
    if active is None and amp.amp._amp_initialized and _checked(dtype) == 'float32':
        active = 'AMP'  # amp.init called outside this package
    if active not in (None, _checked(dtype)):
        raise RuntimeError(
            'this process already built %s networks, and MXNet 1.9.1\'s AMP is process-wide and '
            'cannot be undone (a %s network would compute in %s, or an earlier one change '
            'precision); train in %s here, or start a new process (in a notebook: restart the '
            'kernel)' % (active, dtype, 'bfloat16' if dtype == 'float32' else 'float32',
                         active))
    if dtype == 'bfloat16' and not amp.amp._amp_initialized:
        amp.init(target_dtype='bfloat16')
    _state['dtype'] = dtype


def init_trainer(trainer, dtype):
    """Hand ``trainer`` to AMP for bfloat16 (``amp.init_trainer``: a step whose gradients are
    not finite is skipped); nothing for float32. Returns ``trainer``."""
    if _checked(dtype) == 'bfloat16':
        from mxnet.contrib import amp
        amp.init_trainer(trainer)
    return trainer
