// The WMMA extension device library: include this from CUDA code.
//   layout.hpp           (lane, element) -> (row, col) for every fragment type (host and device)
//   fragment_traits.hpp  the layout of a nvcuda::wmma::fragment for the compiled architecture
//   primitives.hpp       foreach, foreach_ij, foreach_diagonal, map, fill_zero, make_identity, load_vector, store_vector,
//                        load_matrix_with_op, load_matrices_with_op, store_matrix_with_op
//   split.hpp            fp32 -> (hi, residual) splits for error-corrected products
#pragma once

#include "layout.hpp"
#include "split.hpp"
#if defined(__CUDACC__)
#include "fragment_traits.hpp"
#include "primitives.hpp"
#endif
