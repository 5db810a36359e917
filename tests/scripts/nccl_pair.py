"""An NCCL process group, each rank on its own GPU (torchrun sets RANK, LOCAL_RANK and
WORLD_SIZE): each rank all-reduces rank + 1 and prints the sum. For the GPU tier's NCCL
tests (NCCL refuses two ranks on one GPU)."""

import os
from datetime import timedelta

import torch
import torch.distributed as dist

if __name__ == "__main__":
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(device)
    # Eager initialisation (device_id) and a short timeout: a refusal shows at once.
    dist.init_process_group("nccl", device_id=device, timeout=timedelta(seconds=60))
    value = torch.tensor([float(dist.get_rank() + 1)], device=device)
    dist.all_reduce(value)
    print(f"nccl-sum rank {dist.get_rank()} {value.item()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
