"""Ferrum's GPU kernels, written in Triton.

Every kernel here is compiled ahead of time by ``kernels/build.py`` (one binary per
specialization and architecture, listed in ``specs.py``) and embedded in the ``ferrum`` binary,
which launches them through the CUDA driver. The same sources run in the Triton interpreter
(``interp.py``): the kernel tests and the interpreted device of the Rust backend use it, so CI
runs every kernel without a GPU.

Conventions shared by all kernels:

* activations are f32, rows contiguous, with an explicit row stride (in elements);
* weights are f32, f16 or bf16 (the pointer's element type selects the specialization);
* addresses that can exceed 2**31 elements are computed in int64;
* the KV cache of a layer is ``[num_slots, num_kv_heads, head_dim]`` with
  ``slot = block * block_size + offset``: exactly the scheduler's slot mapping.
"""
