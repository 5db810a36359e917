"""`train` with CUDA's deterministic settings, for the GPU tier's exact-resume test
(tests/gpu/test_train_gpu.py). Usage: python deterministic_train.py TRAIN-FLAGS...

What bit-for-bit needs on a GPU, beyond what a checkpoint holds: cuBLAS's fixed workspace
(CUBLAS_WORKSPACE_CONFIG, read when the first handle is made: set before torch starts
CUDA), torch's deterministic algorithms, and cuDNN without benchmark mode (which picks
convolution algorithms by timing them, so two runs may pick differently). `train` turns
benchmark mode on for speed; this script swaps in the deterministic choice.
"""

import os

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402

import workload.training.build as training_build  # noqa: E402
from workload.train import cli  # noqa: E402


def deterministic_cudnn(*_) -> None:
    """configure_cudnn's stand-in: train's choices (its arguments) give way to determinism."""
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True


if __name__ == "__main__":
    # warn_only: an operation without a deterministic kernel warns instead of stopping
    # the run; the test then shows whether the result still matches bit for bit.
    torch.use_deterministic_algorithms(True, warn_only=True)
    training_build.configure_cudnn = deterministic_cudnn
    cli()  # as the `train` program: it ends the process
