#!/usr/bin/env python3
"""Session 44: the tensor-core dots' fragment layout (923fcf5, kernels/gemv_bulk.cu
gb_mma_stage) emulated on the CPU, pure Python: `python3 mma_layout.py`.

Per the PTX ISA's mma.m16n8k16 layouts (lane L = 4g + t): A's a0a1 is (row g, k 2t..2t+1), a2a3
(row g+8, same k), a4a5 (row g, k 2t+8..), a6a7 (row g+8, k 2t+8..); B's b0b1 (k 2t.., col g),
b2b3 (k 2t+8.., col g); D's c0c1 (row g, col 2t..2t+1), c2c3 (row g+8, same cols). The kernel
puts a lane's 8 weights (4 bf16 pairs) in B as loaded, x row 0's matching pairs in A's rows g
and x row 1's in rows g+8, two tiles a step (h = 0, 1), and reads D[g][g] (lane 4g + g/2,
register g % 2) and D[g+8][g] (register 2 + g % 2). Prints both dots and the plain sums.
"""
import random

rng = random.Random(1)
w = [[rng.gauss(0, 1) for _ in range(8)] for _ in range(32)]
x0 = [[rng.gauss(0, 1) for _ in range(8)] for _ in range(32)]
x1 = [[rng.gauss(0, 1) for _ in range(8)] for _ in range(32)]
D = [[0.0] * 8 for _ in range(16)]
for h in range(2):
    A = [[0.0] * 16 for _ in range(16)]
    B = [[0.0] * 8 for _ in range(16)]
    for L in range(32):
        g, t = L >> 2, L & 3
        for q in range(2):
            A[g][2 * t + q] = x0[L][4 * h + q]  # reg 0: x row 0, pair 2h
            A[g + 8][2 * t + q] = x1[L][4 * h + q]  # reg 1: x row 1, pair 2h
            A[g][2 * t + 8 + q] = x0[L][4 * h + 2 + q]  # reg 2: x row 0, pair 2h + 1
            A[g + 8][2 * t + 8 + q] = x1[L][4 * h + 2 + q]  # reg 3: x row 1, pair 2h + 1
            B[2 * t + q][g] = w[L][4 * h + q]  # reg 0: weights, pair 2h
            B[2 * t + 8 + q][g] = w[L][4 * h + 2 + q]  # reg 1: weights, pair 2h + 1
    for r in range(16):
        for c in range(8):
            D[r][c] += sum(A[r][k] * B[k][c] for k in range(16))
s0 = s1 = 0.0
for L in range(32):
    g, t = L >> 2, L & 3
    c = [D[g][2 * t], D[g][2 * t + 1], D[g + 8][2 * t], D[g + 8][2 * t + 1]]
    if t == g >> 1:
        s0 += c[g & 1]
        s1 += c[2 + (g & 1)]
want0 = sum(a * b for rw, rx in zip(w, x0) for a, b in zip(rw, rx))
want1 = sum(a * b for rw, rx in zip(w, x1) for a, b in zip(rw, rx))
print(f"x row 0: diagonal {s0:.12f}, plain {want0:.12f}")
print(f"x row 1: diagonal {s1:.12f}, plain {want1:.12f}")
assert abs(s0 - want0) < 1e-9 and abs(s1 - want1) < 1e-9
