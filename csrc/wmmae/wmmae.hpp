// The WMMA extension device library: include this from CUDA code.
//   layout.hpp           (lane, element) -> (row, col) for every fragment type (host and device)
//   fragment_traits.hpp  the layout of a nvcuda::wmma::fragment for the compiled architecture, and the fragment
//                        type of a table row (fragment_t, element_types)
//   primitives.hpp       convert, to_float, foreach, foreach_ij (with assign), foreach_diagonal, map, fill_zero,
//                        make_identity, load_vector, store_vector, load_matrix_with_op, load_matrices_with_op, store_matrix_with_op,
//                        foreach_row_quad (has_row_quads)
//   split.hpp            fp32 -> (hi, residual) splits for error-corrected products (split_fp16, split_fp16x2,
//                        their _compensated forms, split_tf32, round_to_tf32) and the float bit helpers they use
#pragma once

#include "layout.hpp"
#include "split.hpp"
#if defined(__CUDACC__)
#include "fragment_traits.hpp"
#include "primitives.hpp"
#endif
