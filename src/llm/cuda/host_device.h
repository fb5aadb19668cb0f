// KILN_HOST_DEVICE marks functions that both the host and the decoder's kernels call, so
// that their logic is tested by host tests where there is no GPU.
#pragma once

#ifdef __CUDACC__
#define KILN_HOST_DEVICE __host__ __device__
#else
#define KILN_HOST_DEVICE
#endif
