"""What `make install` takes and refuses (issue 64): the Pythons it accepts, and one version of
each fact in setup.py, requirements*.txt, the Makefile and docs/install.md."""
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _read(name):
    with open(os.path.join(ROOT, name), encoding='utf-8') as f:
        return f.read()


def _fake_python(tmp_path, version, machine):
    # make runs `$(PYTHON) -c CODE`: this one runs CODE in the real Python, as another version
    # or on another machine would see itself.
    script = tmp_path / 'python'
    script.write_text('#!/bin/sh\nexec %s -c "import platform, sys; sys.version_info = %r; '
                      'platform.machine = lambda: %r; exec(sys.argv[1])" "$2"\n'
                      % (sys.executable, tuple(version), machine))
    script.chmod(0o755)
    return str(script)


@pytest.mark.parametrize('version,machine,line', [
    ((3, 8, 18), 'x86_64', 'is Python 3.8: gluon_mgpu runs on Python 3.9 to 3.13 (3.11 and 3.13 '
                           'tested); run make PYTHON=python3.13 ... (docs/install.md)'),
    ((3, 14, 0), 'x86_64', 'is Python 3.14: gluon_mgpu runs on Python 3.9 to 3.13 (3.11 and 3.13 '
                           'tested); run make PYTHON=python3.13 ... (docs/install.md)'),
    ((3, 12, 1), 'aarch64', None)])
def test_make_install_refuses_a_python_mxnet_cannot_run_on_before_installing_anything(
        tmp_path, version, machine, line):
    python = _fake_python(tmp_path, version, machine)
    venv = tmp_path / 'venv'
    done = subprocess.run(['make', '-s', '-C', ROOT, 'install', 'PYTHON=' + python,
                           'VENV=' + str(venv)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    if line is None:
        line = ('make: error: this machine is aarch64: mxnet 1.9.1 has wheels only for x86_64; '
                'use an x86_64 machine (docs/install.md)')
    else:
        line = 'make: error: %s %s' % (python, line)
    assert done.stderr.splitlines()[0] == line
    assert not venv.exists()  # nothing installed


def test_setup_requirements_makefile_and_docs_agree():
    setup, makefile, docs = _read('setup.py'), _read('Makefile'), _read('docs/install.md')
    requirements = _read('requirements.txt')
    numpy = re.search(r"'numpy(>=[^']+)'", setup)[1]
    assert re.search(r'^numpy%s$' % re.escape(numpy), requirements, re.M)
    assert "python_requires='>=3.9,<3.14'" in setup
    assert '(3, 9) <= v <= (3, 13)' in makefile and 'Python 3.9 to 3.13' in makefile
    assert '3.9 to 3.13' in docs
    # MXNet: installed by the Makefile without its dependencies, in neither list pip resolves.
    assert re.search(r'^MXNET \?= mxnet==1\.9\.1$', makefile, re.M)
    assert 'MXNET=mxnet-cu112==1.9.1' in makefile
    for name in ('requirements.txt', 'requirements-gpu.txt'):
        assert not re.search(r'^mxnet', _read(name), re.M), name
    assert '-r requirements.txt' in _read('requirements-gpu.txt').splitlines()
    # No pin that only numpy 1.23.5 needed.
    for text in (setup, requirements):
        assert '1.23.5' not in text and 'contourpy' not in text
