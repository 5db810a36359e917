"""`bench`: measured images/s of the input pipelines and of training, next to the reference."""
