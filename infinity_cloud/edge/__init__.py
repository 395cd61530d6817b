"""What the command line needs besides the server: the registry of targets
(`target_registry`), Infinity's command line mapped onto ours (`infinity_compat`), and the
checks run before a model loads (`preflight`)."""
