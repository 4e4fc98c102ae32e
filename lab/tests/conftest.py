"""The lab's tests (make lab-test) take the package tests' fixtures: tests/conftest.py, loaded
under a name of its own (pytest names this file conftest too)."""
import importlib.util
import os

_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                     'tests', 'conftest.py')
_spec = importlib.util.spec_from_file_location('gluon_mgpu_tests_conftest', _PATH)
_shared = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_shared)  # gluon_mgpu first (MXNet's threads), Ctrl-C restored

two_cpus, data_dir, max_abs_diff = _shared.two_cpus, _shared.data_dir, _shared.max_abs_diff
