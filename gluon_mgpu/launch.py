"""``python -m gluon_mgpu.launch``: the command line is ``gluon_mgpu/commands/launch.py``
(docs/distributed.md).
"""
import sys

if __name__ == '__main__':
    from gluon_mgpu.commands.launch import main
    sys.exit(main())
