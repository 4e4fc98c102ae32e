"""A run's assembly (``runs``): what the train command and the sweep share, from a resolved run's
settings to ``train`` and its summary line."""
