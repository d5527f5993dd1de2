// Compiler glue shared by every header of the device library.
#pragma once

// Functions that the host code (CPU reference kernels, the fragment_map tables) and device code both call.
#if defined(__CUDACC__)
#define WMMAE_HD __host__ __device__
#else
#define WMMAE_HD
#endif
