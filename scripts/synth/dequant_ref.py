#!/usr/bin/env python3
"""Dequantizes raw blocks with the `gguf` package's numpy reference (gguf.quants), the
independent check of edge-llm's block layouts (tests/kernels_iq.rs and tests/kernels_mxfp4.rs
run it); with --quantize, quantizes f32 values with gguf.quants instead (for the types whose
numpy quantizer is the reference one, as MXFP4's is).

usage: dequant_ref.py TYPE IN.bin OUT.bin
       dequant_ref.py --quantize TYPE IN.f32 OUT.bin
  TYPE: a ggml type name (IQ4_NL, IQ2_XXS, MXFP4, ...); blocks: whole blocks; f32: little-endian.
"""
import sys

import numpy as np
from gguf import GGMLQuantizationType, quants

args = sys.argv[1:]
if args[0] == "--quantize":
    qtype = GGMLQuantizationType[args[1]]
    data = np.fromfile(args[2], dtype="<f4")
    quants.quantize(data.reshape(1, -1), qtype).tofile(args[3])
else:
    qtype = GGMLQuantizationType[args[0]]
    data = np.fromfile(args[1], dtype=np.uint8)
    out = quants.dequantize(data.reshape(1, -1), qtype).astype("<f4")
    out.tofile(args[2])
