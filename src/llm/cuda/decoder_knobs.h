// Choices of the GPU decoder step that change its speed, not its arithmetic's intent: the
// values of the llm.cuda.* parameters (llm/llm_parameters.cc), fixed when a model is made.
// Defaults are what measured fastest on the H200 (docs/llm.md has the figures).
#pragma once

namespace kiln::llm {

struct DecoderKnobs {
    bool pdl = true;                  // programmatic dependent launch (Hopper and later)
    bool fused_argmax = true;         // greedy steps take the argmax in the LM head's epilogue
    bool gemv_row_pairs = true;       // short rows of the small GEMM go in pairs where that pays
    int gemv_half_products = 2;       // 0 f32 products, 1 eight per f16 sum, 2 sixteen, 3 a chunk's
    int gemv_ctas_per_sm = 0;         // cap on the small GEMM's resident CTAs per SM (0: occupancy's)
    bool weights_evict_first = true;  // weight loads marked evict-first in L2
    bool gemv_red_add = true;         // residual adds as L2 reductions
    int gemv_leave_room = 3;          // half waves for the next kernel: 0 off, 1 two chunks, 2 one, 3 by size
    int attention_splits = 16;        // cap on split-key attention's splits (1 to kMaxAttentionSplits)
    int attention_keys = 0;           // keys in flight per group: 0 by load, 4 or 8
    int attention_min_split = 256;    // fewest keys a split takes
};

}  // namespace kiln::llm
