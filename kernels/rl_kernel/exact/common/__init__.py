"""The contract shared by every family of the exact tier: the C++ headers compiled for the CPU, CUDA and HIP
(numerics.h, reduce.h, rowtree.cuh, warptile.cuh, ...) and their numpy transcription (contract.py)."""
