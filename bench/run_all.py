"""`make bench`: run every benchmark script under bench/ in turn."""

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

for script in sorted(HERE.glob("bench_*.py")):
    print(f"== {script.name}", flush=True)
    subprocess.run([sys.executable, str(script)], check=True)
