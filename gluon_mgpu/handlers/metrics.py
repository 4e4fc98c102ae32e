"""What a training run measured: the final summary and the ``--metrics-json`` file, whose layout is
``SCHEMA``. docs/metrics-schema.md is generated from it (``schema_page``) and
docs/outputs.md describes the file.
"""
import json
import math
import platform

from ..devices import format_devices
from .events import PRIORITY, EpochEnd, TrainBegin, TrainEnd
from ..runtime.choices import DEVICES, DTYPES, METHODS
from ..runtime.files import atomic_path

__all__ = ['FORMAT', 'SCHEMA', 'EPOCH_FIELDS', 'epoch_problem', 'summarize', 'format_summary',
           'write_json_atomic', 'MetricsFile']

FORMAT = 'gluon_mgpu-metrics/1'
_FRACTION = {'type': 'number', 'minimum': 0, 'maximum': 1}
_POSITIVE = {'type': 'number', 'exclusiveMinimum': 0}
_LOSS = {'type': ['number', 'null'], 'minimum': 0}
_COUNT = {'type': 'integer', 'minimum': 1}


def _object(description, properties, required=None, closed=False, types='object'):
    """A schema node of an object; ``required`` defaults to all of ``properties``."""
    node = {'type': types, 'description': description,
            'required': list(properties) if required is None else required}
    if closed is not None:
        node['additionalProperties'] = closed
    return dict(node, properties=properties)


SCHEMA = {
    '$schema': 'https://json-schema.org/draft/2020-12/schema',
    'title': 'gluon_mgpu training metrics',
    'type': 'object',
    'required': ['format', 'status', 'arguments', 'devices', 'versions', 'threads', 'placement',
                 'history', 'summary'],
    'additionalProperties': False,
    'properties': {
        'format': {'const': FORMAT,
                   'description': 'Name and version of this layout.'},
        'status': {'enum': ['running', 'finished'], 'description': (
            '"running" while training goes on (still so after the process ended: the run '
            'stopped early); "finished" once the summary is written.')},
        'arguments': _object(
            'The command line after defaults were filled in: one key per flag, dashes turned '
            'into underscores (`--num-gpus` is `num_gpus`).',
            required=['num_gpus', 'batch_size', 'lr', 'epochs', 'device', 'data_dir',
                      'train_limit', 'test_limit', 'seed'],
            closed={'type': ['string', 'integer', 'number', 'boolean', 'null', 'array']},
            properties={
                'num_gpus': dict(_COUNT, description='Number of devices.'),
                'batch_size': dict(_COUNT, description=(
                    'Global batch size, split over the devices.')),
                'lr': dict(_POSITIVE, description='SGD learning rate.'),
                'epochs': dict(_COUNT, description='Number of epochs asked for.'),
                'device': {'enum': list(DEVICES),
                           'description': 'How devices were chosen.'},
                'data_dir': {'type': ['string', 'null'],
                             'description': 'Data folder given, or null (searched).'},
                'train_limit': {'type': ['integer', 'null'], 'minimum': 1,
                                'description': 'First N training images, or null (all).'},
                'test_limit': {'type': ['integer', 'null'], 'minimum': 1,
                               'description': 'First N test images, or null (all).'},
                'seed': {'type': ['integer', 'null'],
                         'description': 'Random seed, or null (none).'},
                'dtype': {'enum': list(DTYPES), 'description': (
                    'What the network computed in (`--dtype`; bfloat16: MXNet\'s AMP, float32 '
                    'parameters). Missing in files of earlier versions: float32.')},
            }),
        'devices': {
            'type': 'array', 'minItems': 1,
            'description': 'The MXNet contexts trained on, as MXNet prints them.',
            'items': {'type': 'string', 'pattern': r'^(cpu|gpu|cpu_pinned|cpu_shared)\(\d+\)$'},
        },
        'versions': _object('Versions of the software that ran.', {
            'gluon_mgpu': {'type': 'string', 'description': 'This package.'},
            'mxnet': {'type': 'string', 'description': 'MXNet.'},
            'python': {'type': 'string', 'description': 'Python.'},
        }),
        'threads': _object(
            'The OpenMP thread count MXNet computes with and who chose it '
            '(`gluon_mgpu.thread_settings()`).',
            properties={
                'omp_num_threads': {'type': ['integer', 'string', 'null'], 'description': (
                    'OMP_NUM_THREADS in force, or null when MXNet chose (half the cores on '
                    'x86).')},
                'cores': dict(_COUNT, description='Cores this process may use.'),
                'source': {'enum': ['gluon_mgpu', 'user', 'mxnet-imported-first'], 'description': (
                    'Who chose: gluon_mgpu (the usable cores, shared out over the simulated '
                    'devices), the user (OMP_NUM_THREADS or MXNET_OMP_MAX_THREADS was set), or '
                    'nobody (MXNet was imported before gluon_mgpu).')},
                'devices': dict(_COUNT, description=(
                    'Simulated CPU devices the choice was made for (1 unless the command or '
                    'GLUON_MGPU_CPU_DEVICES said more).')),
                'cpu_temp_copy': {'type': ['integer', 'string', 'null'], 'description': (
                    'MXNET_CPU_TEMP_COPY in force: the scratch buffers of each pool (one pool '
                    'per thread issuing calls; the package issues every device\'s from its own '
                    'thread); null for MXNet\'s default (4).')},
                'temp_copy_source': {'enum': ['gluon_mgpu', 'user', 'mxnet'], 'description': (
                    'Who chose the scratch buffers ("gluon_mgpu": files of earlier versions, '
                    'which enlarged the pool for simulated devices).')},
            }),
        'placement': _object(
            'Where the run keeps its bytes, per device (in the order of `devices`), measured on '
            'one batch before training; null when not measured.',
            closed=None, types=['object', 'null'],
            properties={
                'method': {'enum': list(METHODS),
                           'description': 'How training is split (`--parallel`).'},
                'devices': {'type': 'array', 'items': {'type': 'string'},
                            'description': 'The devices, as MXNet prints them.'},
                'batch_size': dict(_COUNT, description=(
                    'The batch the activations were measured on.')),
                'parameter_bytes': {'type': 'array', 'items': {'type': 'integer'},
                                    'description': 'Bytes of parameters each device holds.'},
                'activation_bytes': {'type': 'array', 'items': {'type': 'integer'}, 'description': (
                    'Bytes of layer outputs each device computes in one forward pass.')},
                'copied_bytes_per_step': {'type': 'integer', 'minimum': 0, 'description': (
                    'Bytes sent between devices in one training step.')},
            }),
        'history': {
            'type': 'array',
            'description': 'One entry per finished epoch, in order: what `train()` returns.',
            'items': _object('One epoch.', properties={
                'epoch': dict(_COUNT, description='Epoch number, from 1.'),
                'seconds': dict(_POSITIVE, maximum=1e9, description=(
                    'Training time of the epoch (test evaluation not included), measured '
                    'after all devices finished; at most 1e9 (31 years), so that sums over '
                    'epochs stay finite.')),
                'images_per_sec': dict(_POSITIVE, maximum=1e12, description=(
                    'Training images per second in this epoch; at most 1e12.')),
                'train_loss': dict(_LOSS, description=(
                    'Mean softmax cross-entropy over the epoch\'s training images; null if '
                    'it was not finite (training diverged).')),
                'train_acc': {'type': ['number', 'null'], 'minimum': 0, 'maximum': 1,
                              'description': (
                    'Fraction of training images classified right while training; null for '
                    'a split network (`--parallel layers|channels|scratch`), whose step '
                    'returns only its loss.')},
                'test_acc': dict(_FRACTION, description=(
                    'Fraction of test images classified right after the epoch.')),
            }),
        },
        'summary': _object(
            'null until training finished; then the final numbers.', types=['object', 'null'],
            properties={
                'test_acc': dict(_FRACTION, description='Test accuracy after the last epoch.'),
                'train_loss': dict(_LOSS, description='Training loss of the last epoch.'),
                'sec_per_epoch': dict(_POSITIVE, description='Mean training seconds per epoch.'),
                'images_per_sec': dict(_POSITIVE, description=(
                    'Training images per second over all epochs.')),
                'epochs': dict(_COUNT, description='Number of epochs trained.'),
                'line': {'type': 'string', 'description': (
                    'The summary line printed at the end, e.g. `test acc: 0.91, 12.3 sec/epoch '
                    'on [gpu(0), gpu(1)]`.')},
            }),
    },
}
EPOCH_FIELDS = tuple(SCHEMA['properties']['history']['items']['required'])

_JSON_TYPES = {'number': (int, float), 'integer': (int,), 'null': (type(None),)}


def epoch_problem(entry):
    """What is wrong with one epoch record (``SCHEMA``'s ``history`` item: what ``train()``
    returns per epoch, what a checkpoint and the book table record), or None. The one check of
    an epoch record: bounds as the schema gives them, finite numbers, no bool for a number."""
    if not isinstance(entry, dict):
        return 'an epoch record is %s, not an object' % type(entry).__name__
    for name, rule in SCHEMA['properties']['history']['items']['properties'].items():
        if name not in entry:
            return 'it lacks %s' % name
        value, types = entry[name], rule['type']
        types = types if isinstance(types, list) else [types]
        kinds = tuple(k for t in types for k in _JSON_TYPES[t])
        ok = isinstance(value, kinds) and not isinstance(value, bool) and (
            value is None or ((abs(value) < 2 ** 63 or isinstance(value, float))
                              and math.isfinite(value)
                              and value >= rule.get('minimum', value)
                              and value <= rule.get('maximum', value)
                              and ('exclusiveMinimum' not in rule
                                   or value > rule['exclusiveMinimum'])))
        if not ok:
            text = json.dumps(value) if isinstance(value, (float, str, bool)) else \
                'a whole number of %d digits' % len(str(abs(value))) if isinstance(value, int) \
                and abs(value) >= 2 ** 63 else str(value) if isinstance(value, int) else \
                type(value).__name__
            return '%s is %s, not %s' % (name, text[:40], _type_text(rule))
    return None


def _finite_or_none(x):
    return x if math.isfinite(x) else None


def format_summary(history, devices):
    """The newer edition's closing line: ``test acc: 0.91, 12.3 sec/epoch on [gpu(0), gpu(1)]``."""
    seconds = sum(r['seconds'] for r in history) / len(history)
    return 'test acc: %.2f, %.1f sec/epoch on %s' % (history[-1]['test_acc'], seconds,
                                                    format_devices(devices))


def summarize(history, devices):
    """The final numbers (``SCHEMA``'s ``summary``) of ``train()``'s history."""
    if not history:
        raise ValueError('history is empty; train at least one epoch before summarizing')
    seconds = sum(r['seconds'] for r in history)
    images = sum(r['images_per_sec'] * r['seconds'] for r in history)
    return {'test_acc': history[-1]['test_acc'],
            'train_loss': _finite_or_none(history[-1]['train_loss']),
            'sec_per_epoch': seconds / len(history),
            'images_per_sec': images / seconds,
            'epochs': len(history),
            'line': format_summary(history, devices)}


def write_json_atomic(path, obj):
    """Write ``obj`` as JSON to ``path`` atomically, flushed to disk (``files.atomic_path``:
    raises ``files.OutputError`` for a target that is not a regular file or a failed write)."""
    with atomic_path(path) as tmp:
        with open(tmp, 'w') as f:
            json.dump(obj, f, indent=2, allow_nan=False)
            f.write('\n')


class MetricsFile(TrainBegin, EpochEnd, TrainEnd):
    """The ``--metrics-json`` file of one run, rewritten atomically at every change.

    Written at once when created (so a bad path fails before training), then as an event
    handler: a resumed run's earlier epochs, each new epoch, the summary. ``arguments`` is
    ``vars(args)``; ``placement`` the bytes per device (``make_parallel(...).summary(X)``).
    """

    def __init__(self, path, arguments, devices, placement=None):
        import mxnet as mx
        from .._version import __version__
        from ..runtime.threads import thread_settings
        self.path = path
        self.data = {'format': FORMAT,
                     'status': 'running',
                     'arguments': dict(arguments),
                     'devices': [str(d) for d in devices],
                     'versions': {'gluon_mgpu': __version__, 'mxnet': mx.__version__,
                                  'python': platform.python_version()},
                     'threads': thread_settings(),
                     'placement': placement,
                     'history': [],
                     'summary': None}
        write_json_atomic(self.path, self.data)

    priority = PRIORITY['MetricsFile']

    def train_begin(self, estimator, *args, **kwargs):
        for record in estimator.history:
            self.add_epoch(record)

    def epoch_end(self, estimator, *args, **kwargs):
        self.add_epoch(estimator.record)

    def train_end(self, estimator, *args, **kwargs):
        self.finish(summarize(estimator.history, estimator.devices))

    def add_epoch(self, record):
        """Append one epoch's record and rewrite the file."""
        entry = {k: record[k] for k in EPOCH_FIELDS}
        entry['train_loss'] = _finite_or_none(entry['train_loss'])
        self.data['history'].append(entry)
        write_json_atomic(self.path, self.data)

    def finish(self, summary):
        """Store the summary (from ``summarize``), mark the run finished and rewrite the file."""
        self.data.update(summary=dict(summary), status='finished')
        write_json_atomic(self.path, self.data)


_BOUNDS = (('minimum', '>= %s'), ('exclusiveMinimum', '> %s'), ('maximum', '<= %s'),
           ('minItems', 'at least %d item'))


def _type_text(node):
    if 'const' in node:
        return '`%s`' % json.dumps(node['const'])
    if 'enum' in node:
        return ' or '.join('`%s`' % json.dumps(v) for v in node['enum'])
    types = node.get('type', 'any')
    text = ' or '.join(types) if isinstance(types, list) else types
    bounds = [form % node[key] for key, form in _BOUNDS if key in node]
    return text + (' (%s)' % ', '.join(bounds) if bounds else '')


def _rows(node, path):
    rows = [(path, _type_text(node), node.get('description', ''))] if path else []
    if 'properties' in node:
        for name, child in node['properties'].items():
            rows += _rows(child, '%s.%s' % (path, name) if path else name)
        extra = node.get('additionalProperties')
        if isinstance(extra, dict):
            rows.append(('%s.*' % path, _type_text(extra), 'Further flags (other options).'))
    if 'items' in node:
        item = node['items']
        if 'properties' in item:
            rows += _rows(item, '%s[]' % path)
        else:
            rows.append(('%s[]' % path, _type_text(item),
                         'Pattern `%s`.' % item['pattern'] if 'pattern' in item else ''))
    return rows


def schema_page():
    """The Markdown of docs/metrics-schema.md, made of ``SCHEMA``
    (``python -m gluon_mgpu.handlers.metrics > docs/metrics-schema.md``)."""
    lines = ['# The `--metrics-json` file', '',
             '<!-- Generated by `python -m gluon_mgpu.handlers.metrics > '
             'docs/metrics-schema.md` from',
             '     gluon_mgpu/handlers/metrics.py (SCHEMA); tests/test_metrics.py checks they '
             'agree. -->',
             '',
             '`python -m gluon_mgpu.train --metrics-json run.json` writes one JSON object. It is '
             'written',
             'when training starts and again after every epoch, each time to a temporary file '
             'that then',
             'replaces `run.json`, so a reader never sees half a file and a run that stops early '
             'keeps the',
             'epochs it finished (`status` stays `"running"`, `summary` stays `null`).',
             '',
             '| field | type | meaning |',
             '| --- | --- | --- |']
    # A '|' inside a cell would end it.
    lines += ['| `%s` | %s | %s |' % tuple(cell.replace('|', '\\|') for cell in row)
              for row in _rows(SCHEMA, '')]
    lines += ['', 'Format `%s`. The same as a JSON Schema (draft 2020-12):' % FORMAT, '',
              '```json', json.dumps(SCHEMA, indent=2), '```', '']
    return '\n'.join(lines)


if __name__ == '__main__':
    print(schema_page(), end='')
