"""GPU sampling: the NVML backend over nvidia-ml-py, and a fake `pynvml` for machines without a GPU."""
