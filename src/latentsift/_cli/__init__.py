"""The command groups of ``latentsift.cli`` (private): each module exposes ``register(app)``; the
command line imports them by name, so nothing is re-exported here."""
__all__: list[str] = []
