"""The package's layout: the chapter's modules at the top, no import cycle, no pickle."""
import ast
import os
import re

import gluon_mgpu

PACKAGE = os.path.dirname(gluon_mgpu.__file__)


def _modules():
    """``{dotted name: path}`` of every module of the package (packages by their __init__)."""
    mods = {}
    for folder, _, files in os.walk(PACKAGE):
        for f in files:
            if f.endswith('.py'):
                path = os.path.join(folder, f)
                rel = os.path.relpath(path, os.path.dirname(PACKAGE))[:-3].replace(os.sep, '.')
                mods[rel[:-len('.__init__')] if rel.endswith('.__init__') else rel] = path
    return mods


def _imports(name, path, mods):
    """The package's modules that ``name`` imports anywhere (in functions too)."""
    here = name if path.endswith('__init__.py') else name.rpartition('.')[0]
    found = set()
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                parts = here.split('.')
                base = '.'.join(parts[:len(parts) - node.level + 1] +
                                ([node.module] if node.module else []))
            else:
                base = node.module or ''
            names = {base + '.' + a.name for a in node.names} & mods.keys()
            found |= names or ({base} & mods.keys())
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names} & mods.keys()
    # Every module imports the package (its __init__) and its own folder's __init__ first.
    return {m for m in found if not mods[m].endswith('__init__.py') or m == 'gluon_mgpu.replicas'
            } - {name}


def _cycle(graph):
    """One import cycle as a list of modules, or None."""
    state = {}

    def visit(m, trail):
        state[m] = 'open'
        for n in sorted(graph[m]):
            if state.get(n) == 'open':
                return trail[trail.index(n):] + [n]
            if n not in state:
                found = visit(n, trail + [n])
                if found:
                    return found
        state[m] = 'done'
        return None

    for m in sorted(graph):
        if m not in state:
            found = visit(m, [m])
            if found:
                return found
    return None


def test_no_module_imports_one_that_imports_it_back():
    mods = _modules()
    graph = {m: _imports(m, p, mods) for m, p in mods.items()}
    assert 'gluon_mgpu.parallel.weighted' in graph['gluon_mgpu.assembly.runs']
    assert _cycle(graph) is None
    # The check finds a cycle when there is one (balance.py and training.py had one).
    graph['gluon_mgpu.training'] = graph['gluon_mgpu.training'] | {'gluon_mgpu.parallel.common'}
    assert _cycle(graph) == ['gluon_mgpu.training', 'gluon_mgpu.parallel.common',
                             'gluon_mgpu.training']


# The package's layers, lowest first: a module imports modules of its own layer or below only.
# Above them: the entry files (gluon_mgpu/train.py, ..., replicas/__main__.py) and __init__.
LAYERS = (('runtime', '_version'), ('devices', 'data', 'model', 'replicas'), ('handlers',),
          ('training', 'train_checks'), ('parallel',), ('assembly', 'commands'))


def _layer(name):
    parts = name.split('.')
    if len(parts) > 1 and parts[-1] != '__main__':
        for i, names in enumerate(LAYERS):
            if parts[1] in names:
                return i
    return len(LAYERS)


def test_no_module_imports_one_from_a_layer_above_it():
    mods = _modules()
    upward = sorted((m, n) for m, p in mods.items() for n in _imports(m, p, mods)
                    if _layer(n) > _layer(m))
    assert upward == []
    # The rule finds one (handlers/checkpoint.py imported training.network_name), and the
    # handler classes live in handlers/.
    assert _layer('gluon_mgpu.handlers.checkpoint') < _layer('gluon_mgpu.training')
    handlers = set()
    for m, p in mods.items():
        with open(p) as f:
            if re.search(r'^class \w+\((\w+, )*(Train|Epoch|Batch)(Begin|End)\b', f.read(), re.M):
                handlers.add(m)
    assert 'gluon_mgpu.handlers.replica_check' in handlers
    assert all(m.startswith('gluon_mgpu.handlers.') for m in handlers), handlers
    assert _layer('gluon_mgpu.train') == _layer('gluon_mgpu.replicas.__main__') == len(LAYERS)


def test_no_command_module_imports_another():
    mods = _modules()
    commands = [m for m in mods if m.startswith('gluon_mgpu.commands.')]
    shared = 'gluon_mgpu.commands.cli'  # what they share
    assert {m: sorted(n for n in _imports(m, mods[m], mods)
                      if n.startswith('gluon_mgpu.commands.') and n != shared)
            for m in commands} == dict.fromkeys(commands, [])


def test_the_chapters_modules_are_at_the_top_and_the_rest_in_folders():
    top = sorted(f for f in os.listdir(PACKAGE) if not f.startswith(('_', '.')))
    assert top == ['assembly', 'commands', 'compare.py', 'data.py', 'devices.py', 'env.py', 'handlers',
                   'launch.py', 'model.py', 'parallel', 'replicas', 'runtime', 'sweep.py',
                   'train.py', 'train_checks.py', 'training.py']
    # The command names at the top are entry files that only start their command.
    for command in ('train', 'sweep', 'compare', 'env', 'launch'):
        source = open(os.path.join(PACKAGE, command + '.py')).read()
        assert len(source.splitlines()) <= 9  # docstring, import, the guarded start, main
        assert 'from gluon_mgpu.commands.%s import main' % command in source


def test_nothing_in_the_package_uses_pickle():
    for name, path in _modules().items():
        tree = ast.parse(open(path).read())
        imported = {a.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                    for a in node.names}
        imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        assert not imported & {'pickle', 'cPickle', 'dill', 'shelve'}, name


def test_the_version_is_written_once():
    # gluon_mgpu/_version.py holds it; setup.py reads that file, the modules import it from
    # there (not from the package above them).
    import importlib.metadata
    from gluon_mgpu import _version
    assert gluon_mgpu.__version__ == _version.__version__ == importlib.metadata.version(
        'gluon_mgpu')
    written = []
    for m, p in _modules().items():
        with open(p) as f:
            text = f.read()
        pattern = r'^\s*__version__ = |from \.+ import __version__'
        if m != 'gluon_mgpu._version' and re.search(pattern, text, re.M):
            written.append(m)
    assert written == []
    with open(os.path.join(os.path.dirname(os.path.dirname(gluon_mgpu.__file__)),
                           'setup.py')) as f:
        assert "version=VERSION," in f.read()


def test_simulated_devices_are_defined_once_and_the_chapters_names_are_its_own():
    # One rule says which devices are simulated (devices.simulated); no other function of the
    # package decides it again under another name.
    defined = sorted('%s.%s' % (m, node.name) for m, p in _modules().items()
                     for node in ast.walk(ast.parse(open(p).read()))
                     if isinstance(node, ast.FunctionDef) and 'simulated' in node.name)
    assert defined == ['gluon_mgpu.devices.simulated']
    # training.__all__ names what training.py defines, not what it imports.
    from gluon_mgpu import training
    tree = ast.parse(open(training.__file__).read())
    own = {t.id for node in tree.body if isinstance(node, ast.Assign) for t in node.targets
           if isinstance(t, ast.Name)} | {node.name for node in tree.body
                                          if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    assert set(training.__all__) <= own, set(training.__all__) - own
    assert 'train' in training.__all__ and 'split_batch' in training.__all__
