"""Build DeepSpeed's C++ ops once at set-up, so the first ZeRO-2 stage does not stall compiling them.

cpu_adam (the offloaded optimizer) takes about 45 s and shm_comm (CPU collectives) about 25 s on
2 cores; both are cached under TORCH_EXTENSIONS_DIR.
"""

import time

from deepspeed.ops.op_builder import CPUAdamBuilder, ShareMemCommBuilder

for builder in (CPUAdamBuilder(), ShareMemCommBuilder()):
    started = time.time()
    builder.load(verbose=False)
    print(f"deepspeed op {builder.NAME}: ready ({time.time() - started:.0f}s)")
