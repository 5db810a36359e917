"""Training workload for PyTorch on HPC GPU clusters."""

__version__ = "0.1.0"
