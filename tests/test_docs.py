"""The README, the pages of docs/ and the notebooks' Markdown: every relative link resolves to a
file of the repository, and every anchor to a heading of its page (as GitHub makes them), so a
page or record moved or renamed fails here instead of in a reader's browser; the README stays
one a newcomer reads in minutes."""
import glob
import json
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = ['README.md'] + sorted(os.path.relpath(p, ROOT)
                               for p in glob.glob(os.path.join(ROOT, 'docs', '*.md')))
NOTEBOOKS = sorted(os.path.relpath(p, ROOT)
                   for p in glob.glob(os.path.join(ROOT, 'notebooks', '*.ipynb')))
# A link or image, [text](target) or ![alt](target); code is no link.
LINK = re.compile(r'!?\[[^\]\n]*\]\(([^)\s]+)\)')
CODE = re.compile(r'```.*?```|`[^`\n]*`', re.S)


def anchors(text):
    """The anchors GitHub gives a Markdown page's headings: lower case, punctuation but hyphens
    dropped, spaces as hyphens, a repeated one numbered (``-1``, ``-2``)."""
    found, seen = set(), {}
    for heading in re.findall(r'^#{1,6} +(.*?) *#*$', re.sub(r'```.*?```', '', text, flags=re.S),
                              re.M):
        slug = re.sub(r'[^\w\- ]', '', heading.lower()).replace(' ', '-')
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else '%s-%d' % (slug, count))
    return found


def links(page):
    """``(target, anchor)`` of every relative link of ``page`` (a path from the root)."""
    with open(os.path.join(ROOT, page), encoding='utf-8') as f:
        text = f.read()
    if page.endswith('.ipynb'):
        text = '\n'.join(''.join(c['source']) for c in json.loads(text)['cells']
                          if c['cell_type'] == 'markdown')
    text = CODE.sub('', text)
    for target in LINK.findall(text):
        if re.match(r'[a-z]+:', target):
            continue  # http:, https:, mailto: are not files of ours
        path, _, anchor = target.partition('#')
        yield path, anchor


def test_anchors_are_githubs():
    assert anchors('# The book, side by side\n## `make demo`: what it runs\n## Notes\n## Notes\n'
                   '```\n# not a heading\n```\n') == {
        'the-book-side-by-side', 'make-demo-what-it-runs', 'notes', 'notes-1'}


@pytest.mark.parametrize('page', PAGES + NOTEBOOKS)
def test_every_relative_link_resolves(page):
    bad = []
    for path, anchor in links(page):
        target = os.path.normpath(os.path.join(ROOT, os.path.dirname(page), path)) if path \
            else os.path.join(ROOT, page)
        if not os.path.exists(target):
            bad.append('%s: no such file' % (path or page))
        elif anchor and target.endswith('.md'):
            with open(target, encoding='utf-8') as f:
                if anchor not in anchors(f.read()):
                    bad.append('%s#%s: no such heading' % (path, anchor))
    assert not bad, '%s: %s' % (page, '; '.join(bad))


def test_the_readme_is_read_in_two_minutes():
    with open(os.path.join(ROOT, 'README.md'), encoding='utf-8') as f:
        lines = f.read().split('\n')
    assert len(lines) <= 120
    # Its first screen: the two commands, then the demo's output, then the picture.
    text = '\n'.join(lines)
    assert text.index('make demo    #') < text.index('make test    #') < text.index(
        'epoch 2, training time:') < text.index('(docs/figures/book-accuracy.png)')


def test_the_docs_index_lists_every_page_once():
    with open(os.path.join(ROOT, 'docs', 'README.md'), encoding='utf-8') as f:
        listed = re.findall(r'^\| \[([\w.-]+\.md)\]\(\1\) \| ', f.read(), re.M)
    pages = sorted(os.path.basename(p) for p in PAGES if p.startswith('docs/'))
    assert sorted(listed) == [p for p in pages if p != 'README.md']


# Finished experiments whose scripts left the tree (issue 66); their pages stay.
RETIRED = ('engines', 'bnrelu', 'bn_relu_race', 'candidates', 'replica_check', 'parallelism',
           'bn_causes', 'epoch_end')


def test_a_retired_experiments_page_names_a_commit_that_holds_its_script():
    import subprocess
    named = {}
    for page in glob.glob(os.path.join(ROOT, 'docs', '*.md')):
        text = open(page, encoding='utf-8').read()
        for commit, path in re.findall(r'`git show ([0-9a-f]{7,40}):(benchmarks/\w+\.py)`', text):
            named.setdefault(path, set()).add(commit)
            found = subprocess.run(['git', '-C', ROOT, 'cat-file', '-e', '%s:%s' % (commit, path)],
                                   capture_output=True, text=True)
            assert found.returncode == 0, (page, commit, path, found.stderr)
    retired = {'benchmarks/%s.py' % name for name in RETIRED}
    assert set(named) == retired
    assert not [p for p in retired if os.path.exists(os.path.join(ROOT, p))]
