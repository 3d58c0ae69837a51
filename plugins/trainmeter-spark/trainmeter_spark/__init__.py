"""trainmeter-spark: the ``spark`` platform adapter and the GB10 device spec, for tm on an NVIDIA DGX Spark."""

__version__ = "0.1.0"
