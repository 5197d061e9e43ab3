#!/usr/bin/env python3
"""Rewrites an ops/cuda/ source for the HIP CPU runtime (tools/cuda_on_cpu/README.md): the CUDA
headers become cuda_shim.hpp and every kernel<<<grid, block, shared, stream>>>(args) launch
becomes hipLaunchKernelGGL((kernel), grid, block, shared, stream, args).
    translate.py IN OUT"""
import re
import sys

src, dst = sys.argv[1], sys.argv[2]
text = open(src).read()
text = text.replace('#include <cuda_fp16.h>', '#include "cuda_shim.hpp"').replace('#include <cuda_runtime.h>', '')
launch = re.compile(r'([A-Za-z_][A-Za-z_0-9]*(?:<[^<>]*>)?)<<<(.*?)>>>\(', re.S)
text = launch.sub(lambda m: 'hipLaunchKernelGGL((' + m.group(1) + '), ' + m.group(2) + ', ', text)
open(dst, 'w').write(text)
