"""The RL training run: which data each iteration uses and what it may train on (`schedule`), and
the live objects of a run in one process (`session`: engines, trainer, environment)."""
