"""``python -m gluon_mgpu.launch``: runs ``gluon_mgpu/commands/launch.py`` (docs/distributed.md)."""
import sys

if __name__ == '__main__':
    from gluon_mgpu.commands.launch import main
    sys.exit(main())
