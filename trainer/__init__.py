"""rlgate trainer: Celery jobs that turn rated trajectories into LoRA adapters.

Where each fact is declared (once):

- A training knob: one ``knob()`` field (trainer/knobs.py) with its default, range and
  help; the loss's in ``LossConfig`` (trainer/loss.py), the others in ``TrainConfig``
  (trainer/config.py), which inherits them. The range checks and docs/trainer.md's table
  derive from the fields. A new loss term: its knob and its term in trainer/loss.py, its
  metric (if any) in trainer/metrics.py, and the regenerated table in docs/trainer.md.
- A training metric: one row of trainer/metrics.py ``METRICS`` (how a step combines it,
  whether the run summary and the dashboard show it); its value where it is computed
  (trainer/loss.py ``ppo_loss`` or the step record of trainer/train.py).
- A reward source (verifier or judge): one ``RewardSource`` registration
  (trainer/reward_source.py), collected in trainer/reward_registry.py: a built-in answer
  verifier is a decorated function in trainer/builtin_verifiers.py. Spec checks, the
  verifier task and the eval gate derive from the registry.
"""
