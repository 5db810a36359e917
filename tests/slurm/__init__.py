"""A private SLURM cluster for the test suite (see cluster.py and fixture.py)."""
