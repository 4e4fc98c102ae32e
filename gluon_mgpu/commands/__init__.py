"""The command lines: ``python -m gluon_mgpu.<command>`` runs ``main`` of the module of that name
here, through a short entry file at the package's top (docs/outputs.md lists what each writes)."""
