"""What tests/gpu/run_on_gpu.sh asks of the Python that holds torch, as a script (so that the
test suite's warm Python, tests/warm_python.py, can run it without importing torch again).

  device_info.py lib      torch's lib folder (for LD_LIBRARY_PATH)
  device_info.py device   the device and versions as one JSON line (device.json)
"""

import json
import os
import platform
import sys

import torch


def device():
    d = {"python": platform.python_version(), "torch": torch.__version__, "cuda_runtime": torch.version.cuda,
         "cuda_available": torch.cuda.is_available()}
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        d.update(gpu=p.name, gpu_memory_gib=round(p.total_memory / 2**30, 1), sm_count=p.multi_processor_count,
                 capability=f"{p.major}.{p.minor}", nccl=".".join(map(str, torch.cuda.nccl.version())))
    return d


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else ""
    if what == "lib":
        print(os.path.join(os.path.dirname(torch.__file__), "lib"))
    elif what == "device":
        print(json.dumps(device()))
    else:
        sys.exit("usage: device_info.py lib|device")
