"""A user's script that fails the same way every time: rank 1 raises at step 3 (the recovery tests)."""
import os
import time

rank = int(os.environ.get("RANK", "0"))
print(f"attempt {os.environ.get('MULTINODE_DS_ATTEMPT')} rank {rank} starts", flush=True)
for step in range(1, 6):
    time.sleep(0.5)
    print(f"rank {rank} step {step}", flush=True)
    if rank == 1 and step == 3:
        raise ValueError("the data at step 3 is bad")
