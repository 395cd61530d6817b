"""What the command line needs besides the server and the targets: the registry of targets
(`target_registry`), Infinity's command line mapped onto ours (`infinity_compat`), and the
client of a running server's admin routes (`admin_client`). It sits above the targets, which
the registry names."""
