"""Training: the one build path of a training state (build.py), the epoch loop with its
hooks (trainer.py) and `run()`, which reads top to bottom: init, data, state, resume, fit,
summary (run.py)."""
