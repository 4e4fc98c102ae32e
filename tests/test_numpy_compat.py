"""gluon_mgpu.runtime.numpy_compat: numpy 1's names that MXNet 1.9.1 reads, given back to numpy 2
and nothing else; in place before MXNet in any import order (issue 64)."""
import math
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from gluon_mgpu.runtime import numpy_compat

# A fresh interpreter of this environment (its .pth hook included), where nothing has imported
# MXNet yet: numpy there is as numpy ships it.
_UNTOUCHED = textwrap.dedent('''
    import json, sys, warnings
    import numpy
    warnings.simplefilter('ignore')
    before = {name: id(getattr(numpy, name)) for name in dir(numpy) if hasattr(numpy, name)}
    sys.path.insert(0, sys.argv[1])
    from gluon_mgpu.runtime import numpy_compat
    missing = sorted(n for n in numpy_compat.NAMES if not hasattr(numpy, n))
    added = numpy_compat.restore()
    changed = sorted(n for n, i in before.items() if id(getattr(numpy, n)) != i)
    print(json.dumps({'missing': missing, 'added': added, 'changed': changed,
                      'lacking': [n for n in numpy_compat.NAMES if not hasattr(numpy, n)],
                      'again': numpy_compat.restore()}))
''')
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(code, *args, cwd=None):
    done = subprocess.run([sys.executable, '-c', code, *args], capture_output=True, text=True,
                          timeout=300, cwd=cwd)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_restore_adds_exactly_the_names_numpy_lacks_and_changes_none_it_has():
    import json
    seen = json.loads(_run(_UNTOUCHED, ROOT))
    assert seen['changed'] == []  # every name numpy had is the same object afterwards
    assert seen['added'] == seen['missing']
    assert seen['lacking'] == seen['again'] == []
    if np.lib.NumpyVersion(np.__version__) >= '2.0.0':  # what numpy 2 removed and MXNet reads
        assert {'PZERO', 'NINF', 'NaN', 'Inf', 'alltrue', 'mirr', 'compat'} <= set(seen['added'])
    else:
        assert seen['added'] == []


def test_the_names_have_numpy_1_values():
    # This process imported MXNet (conftest), so restore() has run here.
    assert np.PZERO == 0.0 and math.copysign(1, np.PZERO) == 1.0
    assert np.NZERO == 0.0 and math.copysign(1, np.NZERO) == -1.0
    assert (np.PINF, np.NINF, np.Inf) == (math.inf, -math.inf, math.inf)
    assert math.isnan(np.NaN) and math.isnan(np.NAN)
    assert np.alltrue([True, False]) == np.all([True, False])
    assert np.sometrue([True, False]) == np.any([True, False])
    assert np.product([2, 3, 4]) == 24 and np.round_(2.567, 1) == np.round(2.567, 1)
    assert np.trapz([1, 2, 3]) == 4.0
    assert np.msort(np.array([[3, 1], [2, 4]])).tolist() == [[2, 1], [3, 4]]
    assert np.in1d([[1, 2], [3, 2]], [2]).tolist() == [False, True, False, True]
    assert np.int is int and np.compat.basestring is str
    with pytest.raises(RuntimeError, match=r'^In accordance with NEP 32, the function npv was '
                                           r'removed from NumPy version 1\.20\. A replacement'):
        np.npv(0.1, [1, 2])


def test_mxnet_reads_every_name_it_adds():
    # NAMES holds nothing MXNet does not read: each name appears in MXNet's Python files as
    # an attribute (np.PZERO, onp.mirr) or in the lists of names it binds ('product').
    import mxnet
    root = os.path.dirname(mxnet.__file__)
    source = []
    for folder, _, files in os.walk(root):
        for name in files:
            if name.endswith('.py'):
                with open(os.path.join(folder, name), encoding='utf-8', errors='replace') as f:
                    source.append(f.read())
    source = '\n'.join(source)
    unread = [name for name in numpy_compat.NAMES
              if not re.search(r"(?:\b_?o?np|\bnumpy)\.%s\b|'%s'" % (name, name), source)]
    assert unread == []


def test_the_books_first_cell_and_a_plain_import_of_mxnet_work_in_this_environment(tmp_path):
    # The book imports d2lzh (so MXNet) first, before anything of ours: the .pth hook that
    # `make install` writes has restored numpy's names by then. Run outside the checkout.
    cell = textwrap.dedent('''
        import d2lzh as gb
        import mxnet as mx
        from mxnet import autograd, gluon, init, nd
        from mxnet.gluon import loss as gloss, nn, utils as gutils
        import time
        import numpy, sys
        print(mx.__version__, 'gluon_mgpu' in sys.modules, numpy.NINF)
    ''')
    assert _run(cell, cwd=str(tmp_path)).split() == ['1.9.1', 'False', '-inf']
    assert _run('import mxnet; print(mxnet.nd.ones((2,)).sum().asscalar())',
                cwd=str(tmp_path)).split() == ['2.0']
