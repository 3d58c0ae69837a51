"""trainmeter-nsys: Nsight Systems' SQLite export read into trainmeter's profile.import records."""

__version__ = "0.1.0"
