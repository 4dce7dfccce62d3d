"""rlgate gateway: the HTTP front door (API translators, sessions, recording, the engine
client) and the admin dashboard. The commands that start it are in `rlgate/`."""
