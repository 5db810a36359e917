"""The commands of a centre's twin (tests/twins/twin.py): thin stand-ins for what the
suite's machine lacks, each failing where the real one fails.

    python -P -m tests.twins.stand_ins NAME ARGS...
        NAME: srun sbatch apptainer podman enroot git lfs ce-task pyxis-task shifter shifterimg

One module a part: node.py (the twin's config, the node), slurm.py (srun, sbatch),
requests.py (requests.jsonl), images.py (an image file, a runtime's checks), runtimes.py
(apptainer, podman, enroot), container_engine.py (CSCS's), pyxis.py, shifter.py
(NERSC's), tools.py (lfs, git); __main__.py runs one by its name.

TWIN_CONFIG names the twin's JSON (written by twin.py): the centre's node shape,
partitions, account, architectures, file-system roots, the real srun/sbatch and the
SLURM cluster's CPUs a node. A compute node is where SLURM_JOB_ID is set (a job or a
step); the login node everywhere else.

- srun/sbatch check a request against the centre's nodes and partition names (its
  account and QOS are SLURM's accounting's, twin.py), with SLURM's own messages (a
  count of 0, as `$((SLURM_CPUS_ON_NODE / 4))` is outside a job, included), then ask the
  cluster for what it has (its CPUs, its stand-in GPUs with the request's model; no
  memory size), where SLURM itself applies the centre's partitions' time limits and its
  submission rules (twin.py puts them there); sbatch adds the tiny
  training's arguments (TWIN_TRAIN_ARGS) to the job's and sets the centre's job
  variables ($SLURM_TMPDIR). The job sees its request as the centre's SLURM gives it
  (SLURM_CPUS_PER_TASK, SLURM_GPUS_PER_NODE), so the job's own arithmetic runs on the
  centre's numbers; srun scales them to the cluster's. Each step that trains, and each
  job, is written to requests.jsonl (the CPUs each rank gets, the memory a GPU gets, at
  the centre's scale) for the site test to hold against the centre's figures. `srun
  --environment=EDF` is CSCS's Container Engine; `srun --container-image=FILE` is pyxis.
  Under TWIN_STEPS_CHECK=1 (a page mistake's run) a training step's program is the
  layout's check.
- A runtime the centre puts in a module (Alliance's `module load apptainer`) is "command
  not found" until that module is loaded.
- An image is a small JSON file naming its architecture: built (apptainer build, podman
  build) on the node's, pulled for --arch or the node's. Running one on a node of
  another architecture is refused with Apptainer's message; running it runs the host's
  Python environment as the image's, with the container's environment rules. Under
  pyxis a site path the command names must be under --container-mounts; `podman run`
  runs a locally built image through its entrypoint.
- What reaches the internet (a build's or pull's registry, `git clone`, `train
  --download`) does so from a compute node only as the twin's [network] table allows:
  through the centre's proxy, set in the command's environment, directly, or not at all;
  `train --download` then fetches the stand-in internet's CIFAR-shaped archive.
"""

import sys

# How a stand-in starts (the twin's bin/NAME, srun's ce-task and pyxis-task): this Python,
# this package as a module; -P keeps the working folder (a page's clone of the project)
# off sys.path, so the package is the one on PYTHONPATH: the checkout's.
STAND_IN = [sys.executable, "-P", "-m", "tests.twins.stand_ins"]
