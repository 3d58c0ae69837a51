"""A loop that is not PyTorch: declares its steps with emit(), sleeping between them. Writes a marker when done.

usage: emit_loop.py STEPS SLEEP_S MARKER
"""

import sys
import time
from pathlib import Path

from trainmeter_agent import emit

steps, sleep_s, marker = int(sys.argv[1]), float(sys.argv[2]), Path(sys.argv[3])
for i in range(1, steps + 1):
    emit(step=i, tokens=1024)
    emit(train_loss=1.0 / i)
    time.sleep(sleep_s)
marker.write_text(f"done {steps}\n")
