// Reduction of a strided tensor over a set of its dims: one workgroup per output element, 256 threads
// each folding a strided share of the reduced elements, then a tree in workgroup memory.
//
// params: [n_out, n_red, offset, out_shape[OUT_RANK], out_strides[OUT_RANK] (the input's strides of the
//        kept dims), red_shape[RED_RANK], red_strides[RED_RANK]]

{{MATH}}

@group(0) @binding(0) var<storage, read> params: array<u32>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@group(0) @binding(2) var<storage, read> x: array<f32>;

const OUT_RANK: u32 = {{OUT_RANK}}u;
const RED_RANK: u32 = {{RED_RANK}}u;

var<workgroup> partial: array<f32, 256>;

fn combine(a: f32, b: f32) -> f32 {
    return {{COMBINE}};
}

fn decompose(linear: u32, shapes: u32, strides: u32, rank: u32) -> u32 {
    var rest = linear;
    var off = 0u;
    for (var d = rank; d > 0u; d--) {
        let size = params[shapes + d - 1u];
        off += (rest % size) * params[strides + d - 1u];
        rest /= size;
    }
    return off;
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let o = wg.x + wg.y * groups.x;
    if (o >= params[0]) {
        return;
    }
    let n = params[1];
    let base = params[2] + decompose(o, 3u, 3u + OUT_RANK, OUT_RANK);
    let red = 3u + 2u * OUT_RANK;
    var acc = {{INIT}};
    for (var r = lid; r < n; r += 256u) {
        acc = combine(acc, x[base + decompose(r, red, red + RED_RANK, RED_RANK)]);
    }
    partial[lid] = acc;
    workgroupBarrier();
    for (var width = 128u; width > 0u; width >>= 1u) {
        if (lid < width) {
            partial[lid] = combine(partial[lid], partial[lid + width]);
        }
        workgroupBarrier();
    }
    if (lid == 0u) {
        let total = partial[0];
        out[o] = {{FINISH}};
    }
}
