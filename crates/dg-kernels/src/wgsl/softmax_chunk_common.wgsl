// What both passes of the chunked softmax share: their parameters, the online softmax's pairs
// (softmax_online.wgsl) and their workgroup merge (row_reduce.rs, row_max_sum).

struct Params {
    rows: u32,
    cols: u32,
    chunk: u32,
    chunks: u32,
}

//@ONLINE

//@ROW_REDUCE
