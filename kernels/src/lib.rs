//! CUDA kernels: sources, build and load, typed launchers. Knows nothing of models or chat.
