"""rlgate gateway: HTTP front door, recording, the admin dashboard and the CLI (`rlgate`)."""

__version__ = "0.1.0"
