// Embedding lookup from one chunk of the table (rows row_start .. row_start + row_count):
//   out[t, :] = table[ids[t] - row_start, :] * scale   when ids[t] is in the chunk,
// other tokens' rows untouched. One workgroup per token; tokens beyond 65535 wrap into y.

struct Params {
    tokens: u32,
    hidden: u32,
    row_start: u32,
    row_count: u32,
    scale: f32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> ids: array<u32>;
@group(0) @binding(2) var<storage, read> table: array<table_word>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
    let t = wid.x + wid.y * nwg.x;
    if (t >= p.tokens) {
        return;
    }
    let id = ids[t];
    if (id < p.row_start || id - p.row_start >= p.row_count) {
        return;
    }
    let src = (id - p.row_start) * p.hidden;
    let dst = t * p.hidden;
    for (var c = lid.x; c < p.hidden; c += WG) {
        out[dst + c] = load_table(src + c) * p.scale;
    }
}
