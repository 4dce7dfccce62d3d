"""``python -m engine``: the same command as ``rlgate engine``."""

from engine.cli import engine_command

if __name__ == "__main__":
    engine_command(prog_name="python -m engine")
