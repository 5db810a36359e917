"""Training: the one process start of train, evaluate and bench and the one build path of
a training state (build.py), the epoch loop with its hooks and the test-set evaluation
(trainer.py), the progress lines (progress.py) and `run()`, which reads top to bottom:
start, data, state, resume, fit, summary (run.py)."""
