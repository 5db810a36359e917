"""The site pages' twins: a data file per centre (<site>.toml, every value cited), the twin
on the suite's SLURM cluster that runs a page's steps (twin.py, the steps read by
page_steps.py), the centre's module system for the job scripts (site_modules.py) and the
commands the suite's machine lacks (stand_ins/). Above tests/slurm and tests/helpers."""
