#!/usr/bin/env python3
"""Dequantizes raw blocks with the `gguf` package's numpy reference (gguf.quants), the
independent check of edge-llm's block layouts (tests/kernels_iq.rs runs it).

usage: dequant_ref.py TYPE IN.bin OUT.bin
  TYPE: a ggml type name (IQ4_NL, IQ2_XXS, ...); IN.bin: whole blocks; OUT.bin: little-endian f32.
"""
import sys

import numpy as np
from gguf import GGMLQuantizationType, quants

qtype = GGMLQuantizationType[sys.argv[1]]
data = np.fromfile(sys.argv[2], dtype=np.uint8)
out = quants.dequantize(data.reshape(1, -1), qtype).astype("<f4")
out.tofile(sys.argv[3])
