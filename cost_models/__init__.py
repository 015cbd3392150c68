"""Pure cost functions of a `TransformerSpec` and numbers (or numpy arrays of candidates).

- `params`: parameter counts per component (exact counts of the reference layout).
- `flops`: forward/backward FLOPs per micro-batch and the GEMM shapes of a block
  (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using
  Megatron-LM", Sec. 5.1 / Appendix; attention counted as FlopCounterMode counts it).
- `activations`: bytes saved for backward per micro-batch (Korthikanti et al. 2022, "Reducing
  Activation Recomputation in Large Transformer Models", Sec. 4 and Table 2), adapted to what the
  reference implementation actually saves (flash/SDPA, GQA, gated MLP, RMSNorm, no dropout).

Every function accepts Python numbers and numpy arrays for the batch/sequence/parallel-degree
arguments (no Python branching on those), so the scalar estimate and the vectorized search share
one formula.
"""
