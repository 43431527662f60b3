"""One module per `rlparity` subcommand, each with `register(sub)`; cli.py discovers them (pkgutil)."""
