"""The built-in sources of trainmeter: the GPU and host samplers, `tm doctor`, and the fake NVML for machines without a GPU."""
