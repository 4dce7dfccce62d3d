"""rlgate gateway: HTTP front door, settings, database access and the CLI."""

__version__ = "0.1.0"
