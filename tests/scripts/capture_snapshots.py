"""An independent subscriber: writes every live snapshot of a run, as JSON lines, to a file. usage: RUN OUT"""

import sys

import msgspec

from trainmeter_core.bus.client import subscribe
from trainmeter_core.model import records

encoder = msgspec.json.Encoder()
with open(sys.argv[2], "wb", buffering=0) as out:
    out.write(b"ready\n")
    for snapshot in subscribe(sys.argv[1], kinds=["snapshot"]):
        out.write(encoder.encode(records.to_builtins(snapshot)) + b"\n")
