"""The numpy 1 names that MXNet 1.9.1 reads and numpy 2 removed, given back to numpy 2 before
MXNet is imported (docs/install.md, "numpy 2").

MXNet 1.9.1 (2022) is ctypes over ``libmxnet.so``, so its wheel runs on any CPython; what stops
it on numpy 2, the only numpy with wheels for Python 3.12 and later, is a handful of numpy
attributes it reads and numpy 2.0 (or 2.4) removed: ``import mxnet`` binds ``np.PZERO``,
``np.alltrue``, ``np.mirr``, ... and raises ``AttributeError`` without them. :func:`restore`
adds each name of :data:`NAMES` that ``numpy`` lacks, with what numpy 1.23.5 gave under it:

- the constants ``PZERO``, ``NZERO``, ``PINF``, ``NINF``, ``NAN``, ``NaN``, ``Inf``;
- the old spellings ``alltrue``, ``sometrue``, ``product``, ``round_``, ``trapz``: the same
  functions numpy 2 names ``all``, ``any``, ``prod``, ``round``, ``trapezoid``; ``in1d`` and
  ``msort`` as numpy 1 defined them, over ``isin`` and ``sort``;
- ``int`` (``builtins.int``, as numpy 1.23's deprecated alias was), read by ``mxnet.test_utils``;
  ``compat``: numpy's own submodule where numpy still ships it (2.0 to 2.2), else one that holds
  what MXNet reads of it, ``compat.basestring`` (``str``);
- ``mirr``, ``npv``, ``pmt``, ``ppmt``, ``pv``, ``rate``: numpy removed them in 1.20 (NEP 32)
  and numpy 1.23 answered with a stub that raises ``RuntimeError`` when called; so do these.

It changes no name numpy has (with numpy 1.23.5 it adds nothing) and nothing else: MXNet's
computations are its own, in C++. The list is what MXNet 1.9.1's Python files read from
numpy (``import mxnet`` with each missing name in turn, and a search of its source for the
names it reads later), intersected with what numpy 2.0 to 2.4 removed. This file imports only
the standard library at its top: ``gpu_build.py``'s hook (a ``.pth`` file, so ``import mxnet``
in any order, the book's ``import d2lzh`` first included) loads it by path.
"""
import builtins
import importlib
import math
import types
import warnings

__all__ = ['NAMES', 'restore']

_FINANCIAL = ('mirr', 'npv', 'pmt', 'ppmt', 'pv', 'rate')
_CONSTANTS = {'PZERO': 0.0, 'NZERO': -0.0, 'PINF': math.inf, 'NINF': -math.inf,
              'NAN': math.nan, 'NaN': math.nan, 'Inf': math.inf}
_RENAMED = {'alltrue': 'all', 'sometrue': 'any', 'product': 'prod', 'round_': 'round',
            'trapz': 'trapezoid'}
NAMES = tuple(sorted(set(_CONSTANTS) | set(_RENAMED) | set(_FINANCIAL)
                     | {'in1d', 'msort', 'int', 'compat'}))


def _expired(name):
    message = ('In accordance with NEP 32, the function %s was removed from NumPy version 1.20. '
               'A replacement for this function is available in the numpy_financial library: '
               'https://pypi.org/project/numpy-financial' % name)

    def expired(*args, **kwargs):
        raise RuntimeError(message)
    expired.__name__ = name
    return expired


def _values(np):
    """What numpy 1.23.5 had under each of :data:`NAMES`, built over this ``np``."""
    def in1d(ar1, ar2, assume_unique=False, invert=False, *, kind=None):
        return np.isin(ar1, ar2, assume_unique=assume_unique, invert=invert, kind=kind).ravel()

    def msort(a):
        b = np.array(a, subok=True, copy=True)
        b.sort(0)
        return b
    try:
        compat = importlib.import_module(np.__name__ + '.compat')  # deprecated: warns
    except ImportError:
        compat = types.ModuleType('numpy.compat', "numpy 1's numpy.compat, as far as MXNet 1.9.1 "
                                                  'reads it (gluon_mgpu.runtime.numpy_compat)')
        compat.basestring = str
    values = dict(_CONSTANTS, in1d=in1d, msort=msort, int=builtins.int, compat=compat)
    values.update((old, getattr(np, new, None)) for old, new in _RENAMED.items())
    values.update((name, _expired(name)) for name in _FINANCIAL)
    return values


def restore(np=None):
    """Add to ``np`` (default: ``numpy``) each name of :data:`NAMES` it lacks; return the names
    added, sorted (none with numpy 1.23.5). Names numpy has are left as they are."""
    if np is None:
        try:
            import numpy as np
        except ImportError:  # no numpy, so no MXNet: its import says so
            return []
    with warnings.catch_warnings():  # numpy's deprecated names warn when looked up
        warnings.simplefilter('ignore')
        missing = [name for name in NAMES if not hasattr(np, name)]
        if not missing:
            return []
        values = _values(np)
    added = [name for name in missing if values[name] is not None]
    for name in added:
        setattr(np, name, values[name])
    return added
