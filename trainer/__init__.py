"""rlgate trainer: Celery jobs that turn rated trajectories into LoRA adapters."""
