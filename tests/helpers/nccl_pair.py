"""An NCCL process group on GPU 0 for every rank (torchrun sets RANK and WORLD_SIZE): each
rank all-reduces rank + 1 and prints the sum. For the GPU tier's one-GPU NCCL test."""

from datetime import timedelta

import torch
import torch.distributed as dist

if __name__ == "__main__":
    torch.cuda.set_device(0)
    # Eager initialisation (device_id) and a short timeout: a refusal shows at once.
    dist.init_process_group("nccl", device_id=torch.device("cuda", 0),
                            timeout=timedelta(seconds=60))
    value = torch.tensor([float(dist.get_rank() + 1)], device="cuda")
    dist.all_reduce(value)
    print(f"nccl-sum rank {dist.get_rank()} {value.item()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
