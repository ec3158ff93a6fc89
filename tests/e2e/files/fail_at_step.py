"""A user's script that fails at step 3 on rank 1 (the recovery tests): the same way every time, or with --vary in
another way at each attempt (its error names the attempt)."""
import os
import sys
import time

rank = int(os.environ.get("RANK", "0"))
attempt = os.environ.get("MULTINODE_DS_ATTEMPT")
print(f"attempt {attempt} rank {rank} starts", flush=True)
for step in range(1, 6):
    time.sleep(0.5)
    print(f"rank {rank} step {step}", flush=True)
    if rank == 1 and step == 3:
        raise ValueError(("attempt %s: " % attempt if "--vary" in sys.argv else "") + "the data at step 3 is bad")
