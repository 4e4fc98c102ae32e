"""bfloat16 training as an option beside the book's float32, through MXNet's AMP. AMP is
process-wide in MXNet 1.9.1, so ``use_dtype`` guards the switch, and ``check_dtype`` refuses a CPU
that would only emulate bfloat16, or on which oneDNN, under the environment in force, cannot run
it at all (``probe_bfloat16``). docs/precision.md explains it.
"""
import os
import re
import subprocess
import sys

from .choices import DTYPES
from .threads import read_text

__all__ = ['DTYPES', 'BF16_CPU_FLAGS', 'PROBE_SECONDS', 'cpu_flags', 'check_dtype',
           'probe_bfloat16', 'read_probe', 'use_dtype', 'active_dtype', 'init_trainer']

BF16_CPU_FLAGS = ('avx512_bf16', 'amx_bf16')
# oneDNN's avx512_core: without it MXNet 1.9.1 has no bfloat16 convolution (docs/precision.md).
AVX512_CORE_FLAGS = ('avx512f', 'avx512bw', 'avx512vl', 'avx512dq')

# What this process computes in: None until a network is built through use_dtype.
_state = {'dtype': None}

# The probe: what training does first in bfloat16 (AMP, a convolution, BatchNorm, a dense layer,
# forward and backward), with oneDNN saying which instructions it runs with (DNNL_VERBOSE).
_PROBE = """
import mxnet as mx
from mxnet import autograd, gluon, nd
from mxnet.contrib import amp
amp.init(target_dtype='bfloat16')
net = gluon.nn.HybridSequential()
net.add(gluon.nn.Conv2D(2, 3), gluon.nn.BatchNorm(), gluon.nn.Dense(3))
net.initialize()
with autograd.record():
    y = net(nd.ones((2, 1, 5, 5))).sum()
y.backward()
nd.waitall()
print('gluon_mgpu: bfloat16 ran', flush=True)
"""
PROBE_SECONDS = 300
_probed = {}


def cpu_flags(path='/proc/cpuinfo'):
    """The CPU's feature flags (``path``'s first ``flags`` line) as a set; empty if unreadable."""
    found = re.search(r'^flags[^:\n]*:(.*)', read_text(path), re.M)
    return set(found[1].split()) if found else set()


def _checked(dtype):
    if dtype not in DTYPES:
        raise ValueError('dtype must be one of %s, got %r; for example dtype=\'bfloat16\''
                         % (', '.join(DTYPES), dtype))
    return dtype


def read_probe(returncode, out, err):
    """What a run of the probe says: ``{'ok': bool, 'isa': str or None, 'error': str or None}``
    from its exit code, its stdout (oneDNN's verbose lines, ``isa:Intel AVX2``) and stderr (the
    last MXNet error line, or the last line)."""
    found = re.findall(r'^dnnl_verbose,info,cpu,isa:(.*)$', out, re.M)
    ok = returncode == 0 and 'gluon_mgpu: bfloat16 ran' in out
    error = None
    if not ok:
        lines = [line.strip() for line in err.splitlines() if line.strip()]
        errors = [line for line in lines if re.search(r'\w*Error: ', line)]
        error = (errors or lines or ['exit code %d' % returncode])[-1]
        error = re.sub(r'^(\S+\.)?(\w+Error: )+', '', error)[:300]
    return {'ok': ok, 'isa': found[-1].strip() if found else None, 'error': error}


def probe_bfloat16(environ=None, timeout=PROBE_SECONDS):
    """Train one bfloat16 step of a tiny network in a child process under ``environ`` (default
    ``os.environ``, the environment in force), as oneDNN will run it here; see ``read_probe``.

    One probe per environment and process: the train command checks twice. A probe that does
    not end within ``timeout`` seconds is a failure naming it.
    """
    environ = dict(os.environ if environ is None else environ)
    key = tuple(sorted(environ.items()))
    if key not in _probed:
        child = dict(environ, DNNL_VERBOSE='1')
        try:
            run = subprocess.run([sys.executable, '-c', _PROBE], env=child, timeout=timeout,
                                 capture_output=True, text=True, errors='replace')
        except subprocess.TimeoutExpired:
            return {'ok': False, 'isa': None,
                    'error': 'the test did not end within %d s' % timeout}
        _probed[key] = read_probe(run.returncode, run.stdout, run.stderr)
    return dict(_probed[key])


def _emulated(why, force, fix, undo=''):
    """The note for bfloat16 that oneDNN would emulate (``why``) when forced; else ValueError."""
    if not force:
        raise ValueError('%s; %s%s' % (why, undo, fix or 'train in float32, or force bfloat16 '
                                       'anyway (--force-dtype, force_dtype=True)'))
    return '%s (forced)' % why


def _onednn_check(found, force, fix):
    """The refusal of ``probe_bfloat16``'s result ``found``, or whether oneDNN emulates
    bfloat16 (a note when forced); None when it computes in bfloat16."""
    isa, environ = found['isa'], os.environ
    cap = environ.get('DNNL_MAX_CPU_ISA', '')
    capped = ', capped by DNNL_MAX_CPU_ISA=%s' % cap if cap else ''
    if not found['ok']:
        why = 'oneDNN runs with %s here%s' % (isa, capped) if isa else None
        undo = 'unset DNNL_MAX_CPU_ISA' if cap else None
        if environ.get('MXNET_MKLDNN_ENABLED', '').lower() in ('0', 'false'):
            why = ('MXNET_MKLDNN_ENABLED=%s turns oneDNN off, and MXNet 1.9.1 has no bfloat16 '
                   'convolution without it' % environ['MXNET_MKLDNN_ENABLED'])
            undo = 'unset MXNET_MKLDNN_ENABLED'
        elif isa is not None and 'AVX-512' not in isa:
            why += ', and MXNet\'s oneDNN has no bfloat16 convolution below AVX-512'
        raise ValueError('a bfloat16 training step, tried in a child process with this '
                         'environment, stopped with %r%s: training would stop at its first '
                         'step; %s%s' % (found['error'], ' (%s)' % why if why else '',
                                         undo + ', or ' if undo else '',
                                         fix or 'train in float32'))
    if isa is None or 'bfloat16' in isa:
        return None
    return _emulated('oneDNN runs with %s here%s, without bfloat16 instructions, so it would '
                     'emulate bfloat16, slower than float32' % (isa, capped), force, fix,
                     'unset DNNL_MAX_CPU_ISA, or ' if cap else '')


def check_dtype(dtype, devices, force=False, flags=None, fix=None, onednn=None):
    """Check that ``devices`` can train in ``dtype``; return the notes to show (lines).

    A CPU is asked twice: /proc/cpuinfo first, then oneDNN itself, through a bfloat16 step run
    in a child process with the environment in force (``probe_bfloat16``; docs/precision.md).

    Parameters
    ----------
    dtype : {'float32', 'bfloat16'}
    devices : list of mxnet.Context
    force : bool, default False
        Train in bfloat16 where oneDNN would emulate it anyway (slower than float32).
    flags, onednn : optional
        The CPU's feature flags (default ``cpu_flags()``) and what ``probe_bfloat16`` found
        (default: probe, once /proc/cpuinfo passed).
    fix : str, optional
        What a refusal tells the caller to do, after its reason and a ';'.

    Returns the notes: one for a GPU (never run here), one for a forced emulating CPU. Raises
    ValueError for an unknown dtype, for bfloat16 that oneDNN would emulate unless ``force``,
    and where the step fails (no AVX-512, oneDNN off) even then.
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
        emulated = not flags & set(BF16_CPU_FLAGS)
        if emulated:
            notes.append(_emulated('this CPU has neither %s in /proc/cpuinfo, so oneDNN would '
                                   'emulate bfloat16, slower than float32'
                                   % ' nor '.join(BF16_CPU_FLAGS), force, fix))
        note = _onednn_check(probe_bfloat16() if onednn is None else onednn, force, fix)
        if note and not emulated:
            notes.append(note)
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
