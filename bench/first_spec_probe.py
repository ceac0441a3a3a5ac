"""Issue 18 development probe: does the first call an ncu child measures carry extra DRAM writes?

    bash bench/gpu/first_spec_probe.sh   (ncu --metrics dram__bytes_read.sum,dram__bytes_write.sum
        --cache-control none --clock-control none --profile-from-start off ... python
        bench/first_spec_probe.py VARIANT SPEC)

`attnscope.measure.ncu`'s child fills a scratch buffer of 2 x L2 (`fill_`: dirty lines), then per spec warms
the call up twice, reads the scratch (clean lines, to start from a cold L2) and measures one call. A sweep on
2026-12-01 measured the same cuDNN MQA call at 0.190 MiB of writes per head when it was the child's first
spec and 0.139-0.141 when it was the second or third. This script repeats one spec three times in one
process (positions 0, 1, 2), each measured as the child does, with the scratch prepared per VARIANT:

- ``fill``: as the child (``torch.empty(...).fill_(1.0)``);
- ``nofill``: ``torch.empty`` only (uninitialised memory evicts as well and leaves no dirty line);
- ``fill-flush``: ``fill_``, then one more scratch-sized buffer written and read before the first spec;
- ``primer``: ``fill_``, then one profiled range of a tiny read kernel (no marker) before the first spec.
"""
import sys

import torch

from attnscope.measure.ncu import _call

SPECS = [{"impl": "cudnn", "batch": 4, "heads": 17, "kv_heads": 1, "n": 1812, "d": 128, "causal": False,
          "dtype": "bf16"},
         {"impl": "flash", "batch": 1, "heads": 25, "kv_heads": 5, "n": 3793, "d": 128, "causal": False,
          "dtype": "fp16"}]


def main(variant):
    cudart = torch.cuda.cudart()
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    scratch = torch.empty(2 * l2 // 4, dtype=torch.float32, device="cuda")
    if variant in ("fill", "fill-flush", "primer"):
        scratch.fill_(1.0)
    if variant == "primer":
        torch.cuda.synchronize()
        cudart.cudaProfilerStart()
        scratch[:1024].sum()
        torch.cuda.synchronize()
        cudart.cudaProfilerStop()
    if variant == "fill-flush":
        other = torch.empty_like(scratch).fill_(2.0)
        other.sum()
        scratch.sum()
        del other
    torch.cuda.synchronize()
    spec = SPECS[int(sys.argv[2]) if len(sys.argv) > 2 else 0]
    for _ in range(3):  # positions 0, 1, 2
        fn, keep = _call(torch, spec)
        for _ in range(2):
            fn()
        torch.cuda.synchronize()
        scratch.sum()
        torch.cuda.synchronize()
        cudart.cudaProfilerStart()
        torch.cuda._sleep(1000)
        fn()
        torch.cuda.synchronize()
        cudart.cudaProfilerStop()
        del fn, keep
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main(sys.argv[1])
