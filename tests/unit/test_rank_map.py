"""doctor's rank-map checks on hand-written rank places: thread oversubscription per node,
two ranks on one GPU, CPU lists written as taskset does."""

from __future__ import annotations

from workload.doctor.findings import cpu_ranges
from workload.doctor.ranks import crowded_nodes, shared_devices


def test_cpu_ranges_read_like_taskset():
    assert cpu_ranges({0, 1, 2, 5, 7, 8}) == "0-2,5,7-8"
    assert cpu_ranges([3]) == "3"


def place(rank, node, threads=1, cpus=(0,), device="cpu", visible=None):
    return dict(rank=rank, node=node, threads=threads, cpu_list=list(cpus), device=device,
                cuda_visible_devices=visible)


def test_threads_of_ranks_on_one_node_are_added_up():
    assert crowded_nodes([place(0, "a", 2, (0, 1)), place(1, "a", 2, (0, 1)),
                          place(2, "b", 1, (0,)), place(3, "b", 1, (1,))]) == \
        ["a: 4 threads on 2 CPUs"]
    assert crowded_nodes([place(0, "a", 8, (0, 1))]) == []  # one rank: the local check's


def test_two_ranks_on_one_gpu_are_found():
    # Both see all GPUs and picked device 0: one GPU does the work of two.
    assert shared_devices([place(0, "a", device="cuda:0"), place(1, "a", device="cuda:0"),
                           place(2, "b", device="cuda:0")]) == ["a cuda:0: ranks [0, 1]"]
    # --gpus-per-task: each task sees its own GPU as cuda:0.
    assert shared_devices([place(0, "a", device="cuda:0", visible="0"),
                           place(1, "a", device="cuda:0", visible="1")]) == []
