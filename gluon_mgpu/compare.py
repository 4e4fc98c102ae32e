"""``python -m gluon_mgpu.compare``: the command line is ``gluon_mgpu/commands/compare.py``
(docs/notebooks.md).
"""
import sys

if __name__ == '__main__':
    from gluon_mgpu.commands.compare import main
    sys.exit(main())
