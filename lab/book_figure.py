"""The book's accuracy table as a picture: per setting (1 and 2 devices) and epoch, the later
MXNet editions' GPU runs as a violin, the same-code GPU runs as black points, the book's printed
value as a red bar and each seed of ours as a marker of its machine. ``book_table.py --tables``
draws it from the records beside the tables it writes (docs/figures/book-accuracy.png).

The PNG is the same bytes on every drawing with the same matplotlib and Pillow (Agg, a fixed
size and dpi, no date and no software name in it). Its text chunk ``DATA_KEY`` holds what it
plots as JSON (``figure_data``), so a test tells a stale picture from the records on any
version: ``read_data`` of the committed file must equal ``figure_data`` of the records now.
"""
import io
import json
import os

from book_records import NOT_RECORDED, plural

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIGURE = os.path.join(ROOT, 'docs', 'figures', 'book-accuracy.png')
DPI = 100
FIGSIZE = (12.0, 5.6)  # inches: 1200 x 560 pixels at DPI
DATA_KEY = 'gluon_mgpu figure data'
DRAWN_WITH_KEY = 'drawn with'
# One marker and colour per machine key, in key order (A, B, C, ...).
MACHINE_STYLES = (('o', '#1f77b4'), ('s', '#ff7f0e'), ('D', '#2ca02c'), ('^', '#9467bd'),
                  ('v', '#8c564b'), ('P', '#e377c2'))
TITLE = "Test accuracy per epoch: the book's table, the published GPU runs and our seeds on CPUs"


def _machine_label(m):
    """``'ours, machine C: AMD EPYC, AVX-512 kernels, 2 threads'``, from a legend's entry."""
    cpu = m['cpu'].replace('(R)', '').replace('(TM)', '')
    kernels, threads = m['kernels'].split(' (')[0], m['threads'].replace('OMP_NUM_THREADS=', '')
    if (kernels, threads) == (NOT_RECORDED, NOT_RECORDED):
        return 'ours, machine %s: %s (kernels, threads not recorded)' % (m['key'], cpu)
    return 'ours, machine %s: %s, %s kernels, %s threads' % (m['key'], cpu, kernels, threads)


def figure_data(cells, gpu_runs, legend):
    """What the figure plots, JSON-ready: ``cells`` (``book_records.accuracy_cells``),
    ``gpu_runs`` (``book_records.read_gpu_runs``) and ``legend``
    (``book_records.machine_legend``) give per setting and epoch the book's value, the GPU runs'
    accuracies (sorted) and ours (seed, accuracy, machine key), and the machines' labels."""
    panels = []
    for n in (1, 2):
        epochs = [{'epoch': c['epoch'], 'book': c['book'],
                   'same': sorted(gpu_runs['same', n, c['epoch']]),
                   'later': sorted(gpu_runs['later', n, c['epoch']]),
                   'ours': [[r['seed'], r['acc'], r['machine']] for r in c['runs']]}
                  for c in cells if c['devices'] == n]
        panels.append({'title': '%s (batch %d, lr %g)' % (
            plural(n, 'device'), 256 * n, 0.1 * n), 'epochs': epochs})
    return {'title': TITLE, 'panels': panels,
            'machines': [[m['key'], _machine_label(m)] for m in legend]}


def _spread(count, width):
    """``count`` offsets evenly across ``width``, centred on 0 (a deterministic jitter)."""
    if count < 2:
        return [0.0] * count
    return [width * (i / (count - 1) - 0.5) for i in range(count)]


def draw(data):
    """The PNG bytes of ``figure_data``'s ``data``, with ``data`` in its text chunk."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    fig = Figure(figsize=FIGSIZE, dpi=DPI, layout='constrained')
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(data['panels']))
    styles = {key: MACHINE_STYLES[i % len(MACHINE_STYLES)]
              for i, (key, _) in enumerate(data['machines'])}
    counts = {'same': set(), 'later': set()}
    for ax, panel in zip(axes, data['panels']):
        xs = [e['epoch'] for e in panel['epochs']]
        parts = ax.violinplot([e['later'] for e in panel['epochs']], positions=xs, widths=0.75,
                              showextrema=False, showmedians=True)
        for body in parts['bodies']:
            body.set(facecolor='#b0b0b0', edgecolor='#808080', alpha=0.6)
        parts['cmedians'].set_color('#606060')
        for e in panel['epochs']:
            x = e['epoch']
            counts['same'].add(len(e['same']))
            counts['later'].add(len(e['later']))
            ax.scatter([x - 0.14 + d for d in _spread(len(e['same']), 0.1)], e['same'], s=22,
                       color='black', zorder=3)
            ax.hlines(e['book'], x - 0.36, x + 0.36, colors='#d62728', linewidths=3, zorder=4)
            for (seed, acc, key), d in zip(e['ours'], _spread(len(e['ours']), 0.16)):
                marker, colour = styles[key]
                ax.scatter([x + 0.18 + d], [acc], s=60, marker=marker, color=colour,
                           edgecolors='black', linewidths=0.6, zorder=5)
        ax.set_title(panel['title'], fontsize=13)
        ax.set_xticks(xs, ['epoch %d' % x for x in xs], fontsize=11)
        ax.set_xlim(min(xs) - 0.6, max(xs) + 0.6)
        ax.tick_params(axis='y', labelsize=11)
        ax.grid(True, axis='y', alpha=0.4)
    axes[0].set_ylabel('test accuracy after the epoch', fontsize=12)

    def runs(n):
        return '%d' % min(n) if len(n) == 1 else '%d-%d' % (min(n), max(n))
    handles = [Patch(facecolor='#b0b0b0', edgecolor='#808080', alpha=0.6,
                     label='later MXNet editions on GPUs, %s runs (line: median)'
                     % runs(counts['later'])),
               Line2D([], [], marker='o', color='black', linestyle='', markersize=5,
                      label='same code on GPUs (d2lzh), %s runs' % runs(counts['same'])),
               Line2D([], [], color='#d62728', linewidth=3, label="the book's printed value")]
    for key, label in data['machines']:
        marker, colour = styles[key]
        handles.append(Line2D([], [], marker=marker, color=colour, markeredgecolor='black',
                              linestyle='', markersize=8, label=label))
    fig.legend(handles=handles, loc='outside lower center', ncol=2, fontsize=10,
               frameon=False)
    fig.suptitle(data['title'], fontsize=14)
    out = io.BytesIO()
    fig.savefig(out, format='png', dpi=DPI, metadata={
        'Software': None, DATA_KEY: json.dumps(data, sort_keys=True, separators=(',', ':')),
        DRAWN_WITH_KEY: drawn_with()})
    return out.getvalue()


def drawn_with():
    """The versions whose drawing gives the same bytes: ``'matplotlib X, Pillow Y'``."""
    import matplotlib
    import PIL
    return 'matplotlib %s, Pillow %s' % (matplotlib.__version__, PIL.__version__)


def read_png_text(path):
    """The text chunks of a PNG file, ``{key: text}``."""
    from PIL import Image
    with Image.open(path) as image:
        image.load()
        return dict(image.text)


def read_data(path=FIGURE):
    """What the figure at ``path`` plots (``figure_data``), read from its text chunk."""
    return json.loads(read_png_text(path)[DATA_KEY])
