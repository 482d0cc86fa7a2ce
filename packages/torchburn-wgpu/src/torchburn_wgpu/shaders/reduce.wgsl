// Reduction of a strided tensor over a set of its dims: one workgroup per output element, 256 threads
// each folding a strided share of the reduced elements, then a tree in workgroup memory. ARG mode
// (argmax/argmin) carries each candidate's position along, ties going to the first, NaN winning.
// Values fold in ACC: f32, or i32 for integer inputs (exact where an f32 would round above 2^24).
//
// params: [n_out, n_red, offset, out_shape[OUT_RANK], out_strides[OUT_RANK] (the input's strides of
//          the kept dims), red_shape[RED_RANK], red_strides[RED_RANK]]

{{MATH}}

@group(0) @binding(0) var<storage, read> params: array<u32>;
@group(0) @binding(1) var<storage, read_write> out: array<{{OUT_TYPE}}>;
@group(0) @binding(2) var<storage, read> x: array<{{IN_TYPE}}>;

const OUT_RANK: u32 = {{OUT_RANK}}u;
const RED_RANK: u32 = {{RED_RANK}}u;
const ARG: bool = {{ARG}};

var<workgroup> partial: array<{{ACC}}, 256>;
var<workgroup> partial_at: array<u32, 256>;

fn load(v: {{IN_TYPE}}) -> {{ACC}} {
    return {{LOAD}};
}

fn combine(a: {{ACC}}, b: {{ACC}}) -> {{ACC}} {
    return {{COMBINE}};
}

// ARG mode: whether candidate (b, at_b) beats (a, at_a)
fn is_nan(v: {{ACC}}) -> bool {
    return {{IS_NAN}};
}

fn beats(a: {{ACC}}, at_a: u32, b: {{ACC}}, at_b: u32) -> bool {
    if (is_nan(a)) {
        return is_nan(b) && at_b < at_a;
    }
    if (is_nan(b)) {
        return true;
    }
    let better = {{BETTER}};
    return better || (a == b && at_b < at_a);
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
    var at = 0xffffffffu;
    for (var r = lid; r < n; r += 256u) {
        let v = load(x[base + decompose(r, red, red + RED_RANK, RED_RANK)]);
        if (ARG) {
            if (at == 0xffffffffu || beats(acc, at, v, r)) {
                acc = v;
                at = r;
            }
        } else {
            acc = combine(acc, v);
        }
    }
    partial[lid] = acc;
    partial_at[lid] = at;
    workgroupBarrier();
    for (var width = 128u; width > 0u; width >>= 1u) {
        if (lid < width) {
            if (ARG) {
                let other_at = partial_at[lid + width];
                let mine = partial_at[lid];
                if (other_at != 0xffffffffu &&
                    (mine == 0xffffffffu || beats(partial[lid], mine, partial[lid + width], other_at))) {
                    partial[lid] = partial[lid + width];
                    partial_at[lid] = other_at;
                }
            } else {
                partial[lid] = combine(partial[lid], partial[lid + width]);
            }
        }
        workgroupBarrier();
    }
    if (lid == 0u) {
        let total = partial[0];
        let position = partial_at[0];
        out[o] = {{FINISH}};
    }
}
