"""The ``gpu``-marked tests (CUDA, NCCL) and benchmarks/gpu_h100.sh's dry run on CPU."""
