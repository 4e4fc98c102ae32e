"""The door (issue 66): lab/ and tools/ use the package only as ``from gluon_mgpu import NAME``
(or ``gluon_mgpu.NAME``) with NAME in ``gluon_mgpu.__all__``, and its commands as commands
(``python -m gluon_mgpu.train``); never a module of the package or a private name."""
import ast
import os
import re

import gluon_mgpu

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The chapter's names (README) before the door: __all__ grows by at most 15 for it (issue 66).
CHAPTER_NAMES = 34
# Files still reaching past the door: none is left (the speed study's worker went through last).
# This list only shrinks: a file leaves it once it goes through the door.
NOT_YET = set()


def _past_the_door(path):
    """What ``path`` takes from the package other than through the door, as written."""
    with open(os.path.join(ROOT, path)) as f:
        source = f.read()
    found = ['"%s"' % m for m in re.findall(r'(?:from|import) gluon_mgpu\.[\w.]+', source)
             if not m.startswith(('from gluon_mgpu.train', 'import gluon_mgpu.train'))]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or '').startswith('gluon_mgpu'):
            found += ['%s.%s' % (node.module, a.name) for a in node.names
                      if node.module != 'gluon_mgpu' or a.name not in gluon_mgpu.__all__]
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.startswith('gluon_mgpu.')]
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and \
                node.value.id == 'gluon_mgpu' and node.attr not in gluon_mgpu.__all__ + [
                    '__all__', '__version__', '__file__']:
            found.append('gluon_mgpu.' + node.attr)
    return sorted(set(found))


def _scripts():
    return sorted(os.path.join(folder, name)
                  for folder in ('lab', 'lab/tests', 'tools')
                  for name in os.listdir(os.path.join(ROOT, folder)) if name.endswith('.py'))


def test_the_lab_and_the_tools_use_the_package_through_its_door_only():
    past = {path: _past_the_door(path) for path in _scripts()}
    assert {path: names for path, names in past.items()
            if names and path not in NOT_YET} == {}
    assert sorted(path for path in NOT_YET if not past.get(path)) == []  # through: list it no more


def test_the_door_is_at_most_15_names_each_documented():
    names = gluon_mgpu.__all__
    assert len(names) <= CHAPTER_NAMES + 15
    with open(os.path.join(ROOT, 'docs', 'python.md')) as f:
        page = f.read()
    door = page[page.index('## Outside the package'):]
    assert [n for n in ('Parser', 'UsageError', 'CommandError', 'run_command', 'DeferredInterrupt',
                        'CheckpointError', 'lock_dir', 'list_checkpoints', 'read_checkpoint',
                        'restore', 'resolve', 'recorded_settings', 'atomic_path', 'open_input',
                        'output_problem') if '`%s`' % n not in door] == []


def test_no_package_file_names_the_lab():
    named = []
    for folder, _, names in os.walk(os.path.join(ROOT, 'gluon_mgpu')):
        for name in names:
            if name.endswith('.py'):
                with open(os.path.join(folder, name)) as f:
                    named += [name] if re.search(r'\blab/|\bbook_table\b', f.read()) else []
    assert named == []
